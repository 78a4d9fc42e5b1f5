// Cohorts in the dashboard, in a real, headless Debian chromium (playwright-core). An admin puts
// projects in a cohort through the Cohorts form, changes a member's terms, takes a member out and
// deletes a cohort; a tenant of the cohort, whose page has no Cohorts section, launches past its
// quota asking to borrow and sees the cGPU on loan marked. api/tests/dashboard.rs (an_admin_puts_
// projects_in_a_cohort_...) starts gsaasd with alpha's quota at 1 exclusive GPU, beta's at 2, and
// cohort `other` holding gamma, and runs this with:
//   GSAAS_URL             the service's base URL
//   GSAAS_ADMIN_TOKEN     an admin token, GSAAS_TENANT_TOKEN a member token of alpha
//   GSAAS_SCREENSHOTS     where dashboard-cohorts.png goes
//   CHROMIUM              the browser (default /usr/bin/chromium)
// Every wait is bounded; the last line on success is `RESULT {"borrower": VM id}`.
import { join } from 'node:path';
import { bound, check, need, openPage } from './chromium.mjs';

const WAIT_MS = 20000;
const OVERALL_MS = 150000;

const base = need('GSAAS_URL').replace(/\/$/, '');
const adminToken = need('GSAAS_ADMIN_TOKEN');
const tenantToken = need('GSAAS_TENANT_TOKEN');
const shots = need('GSAAS_SCREENSHOTS');
const log = bound('cohorts', OVERALL_MS);
// The refusals provoked (403 over quota, 409 a project of another cohort or a cohort changed
// meanwhile, 422 a limit too high) are logged by Chromium as failed loads; so is the GET of a
// cohort not made yet (404).
const { page, problems, close } = await openPage({
  origin: new URL(base).origin, refusals: [403, 404, 409, 422], viewport: { width: 1280, height: 900 },
  waitMs: WAIT_MS, shots,
});
// What the page asks for while a tenant is signed in.
let tenantSignedIn = false;
const tenantCohortRequests = [];
page.on('request', (request) => {
  if (tenantSignedIn && new URL(request.url()).pathname.startsWith('/v1/cohorts')) {
    tenantCohortRequests.push(request.url());
  }
});

const cohort = (name) => `#cohorts .cohort[data-cohort="${name}"]`;
const member = (name, project) => `${cohort(name)} tr.cohort-member[data-project="${project}"]`;

async function signIn(token) {
  await page.fill('#token', token);
  await page.click('#signin-submit');
  await page.waitForSelector('#main-view:not([hidden])');
}

async function signOut() {
  await page.click('#sign-out');
  await page.waitForSelector('#signin-view:not([hidden])');
}

// Fills the cohort form; limits are {borrowing_limit: {cgpus: '1'}, ...}, blank where not said,
// none per GPU model.
async function fillCohort({ name, project, limits = {}, byDefault = false }) {
  await page.fill('#c-cohort', name);
  await page.fill('#c-project', project);
  for (const which of ['borrowing_limit', 'lending_limit']) {
    for (const resource of ['cgpus', 'memory_mib', 'exclusive_gpus']) {
      await page.fill(`#c-${which}-${resource}`, (limits[which] || {})[resource] || '');
    }
  }
  await page.setChecked('#c-borrow_by_default', byDefault);
  // No limits per model: rows an Edit filled go.
  while (await page.locator('#c-model-limits .model-limit').count() > 0) {
    await page.click('#c-model-limits .model-limit button.remove-model');
  }
}

async function saveCohort(fields) {
  await fillCohort(fields);
  await page.click('#cohort-submit');
}

async function cell(selector) {
  return (await page.textContent(selector)).trim();
}

let failed = false;
const result = {};
try {
  await page.goto(`${base}/`);
  await page.waitForSelector('#signin-view:not([hidden])');
  await signIn(adminToken);
  check((await page.textContent('.who')).includes('admin'), 'signed in as admin');
  await page.waitForSelector('#cohorts-section:not([hidden])');
  await page.waitForSelector(member('other', 'gamma'));
  check(await page.locator('#cohorts .cohort').count() === 1, 'the one cohort there is is listed');

  // What cannot be sent is said beside its field, and nothing changes.
  await saveCohort({ name: 'lab', project: 'alpha', limits: { borrowing_limit: { cgpus: '1.5' } } });
  const notWhole = await page.waitForSelector('[data-error-for="borrowing_limit-cgpus"]:not(:empty)');
  check(/whole number/.test(await notWhole.textContent()), `a fraction is refused: ${await notWhole.textContent()}`);
  check(await page.getAttribute('#c-borrowing_limit-cgpus', 'aria-invalid') === 'true', 'the cGPU limit is marked invalid');
  // A limit past the service's maximum: the service's 422 beside the field it names.
  await saveCohort({ name: 'lab', project: 'alpha', limits: { borrowing_limit: { exclusive_gpus: '10000000000000000' } } });
  const tooHigh = await page.waitForSelector('[data-error-for="borrowing_limit-exclusive_gpus"]:not(:empty)');
  const tooHighText = await tooHigh.textContent();
  check(/maximum/.test(tooHighText), `a limit too high is refused: ${tooHighText}`);
  check(await page.locator('[data-error-for="borrowing_limit-cgpus"]:not(:empty)').count() === 0, 'the old error is cleared');
  // A project of another cohort: the 409 says which.
  await saveCohort({ name: 'lab', project: 'gamma' });
  const conflict = await page.waitForSelector('#cohort-error:not(:empty)');
  check(/In another cohort: .*cohort other/.test(await conflict.textContent()), `the conflict is said: ${await conflict.textContent()}`);
  check(await page.locator(cohort('lab')).count() === 0, 'the refused requests made no cohort');
  log(`refusals shown: ${tooHighText} / ${await conflict.textContent()}`);

  // Alpha borrows at most one whole GPU; beta lends at most one.
  await saveCohort({ name: 'lab', project: 'alpha', limits: { borrowing_limit: { exclusive_gpus: '1' } } });
  await page.waitForSelector(member('lab', 'alpha'));
  check(/Project alpha is in cohort lab now/.test(await page.textContent('#cohort-ok')), 'the page says alpha joined');
  check(await page.locator('#cohort-error:not(:empty)').count() === 0, 'the conflict is cleared');
  check(await cell(`${member('lab', 'alpha')} .borrowing-limit`) === '≤ 1 exclusive GPU', 'alpha\'s borrowing limit shown');
  check(await cell(`${member('lab', 'alpha')} .lending-limit`) === 'no limit', 'alpha lends without limit');
  await saveCohort({ name: 'lab', project: 'beta', limits: { lending_limit: { exclusive_gpus: '1' } } });
  await page.waitForSelector(member('lab', 'beta'));
  check(await cell(`${member('lab', 'alpha')} .borrowing-limit`) === '≤ 1 exclusive GPU', 'alpha kept its terms when beta joined');
  check(await cell(`${member('lab', 'beta')} .lending-limit`) === '≤ 1 exclusive GPU', 'beta\'s lending limit shown');
  // Beta's quota is 2 whole GPUs, none used: it lends 1 (its limit).
  check(await cell(`${member('lab', 'beta')} .member-lendable`) === '1 exclusive GPU', 'beta lends one GPU now');
  check(/lends 2 exclusive GPUs now/.test(await page.textContent(`${cohort('lab')} .cohort-totals`)),
    `the cohort's totals: ${await page.textContent(`${cohort('lab')} .cohort-totals`)}`);

  // Beta's terms changed through Edit: the form holds them, and it borrows by default now.
  await page.click(`${member('lab', 'beta')} button.edit-member`);
  check(await page.inputValue('#c-cohort') === 'lab' && await page.inputValue('#c-project') === 'beta', 'Edit names the member');
  check(await page.inputValue('#c-lending_limit-exclusive_gpus') === '1', 'Edit fills its lending limit');
  check(await page.inputValue('#c-borrowing_limit-exclusive_gpus') === '', 'Edit leaves no limit blank');
  await page.setChecked('#c-borrow_by_default', true);
  await page.click('#cohort-submit');
  await page.waitForFunction((sel) => document.querySelector(sel)?.textContent === 'borrows',
    `${member('lab', 'beta')} .borrow-by-default`);
  check(/Project beta has new terms in cohort lab/.test(await page.textContent('#cohort-ok')), 'the page says beta has new terms');
  check(await cell(`${member('lab', 'beta')} .lending-limit`) === '≤ 1 exclusive GPU', 'beta kept its lending limit');

  // Alpha's loans of one GPU model bounded through Edit (a model the fleet does not have, so its
  // borrowing below is not): rows of the form, each checked before it is sent.
  const modelRow = (n) => `#c-model-limits .model-limit:nth-child(${n})`;
  await page.click(`${member('lab', 'alpha')} button.edit-member`);
  check(await page.locator('#c-model-limits .model-limit').count() === 0, 'alpha has no limit per model yet');
  await page.click('#c-add-model');
  await page.fill(`${modelRow(1)} input.model-name`, 'A100');
  await page.fill(`${modelRow(1)} input[name$="-cgpus"]`, '0');
  await page.click('#c-add-model');
  await page.fill(`${modelRow(2)} input[name$="-cgpus"]`, '2');
  await page.click('#cohort-submit');
  const unnamed = await page.waitForSelector(`${modelRow(2)} .model-limit-head .field-error:not(:empty)`);
  check(/name the GPU model/.test(await unnamed.textContent()), `limits without a model are refused: ${await unnamed.textContent()}`);
  await page.fill(`${modelRow(2)} input.model-name`, 'A100');
  await page.click('#cohort-submit');
  const twice = await page.waitForFunction((sel) => /already/.test(document.querySelector(sel)?.textContent || ''),
    `${modelRow(2)} .model-limit-head .field-error`);
  check(twice, 'a model named twice is refused');
  await page.click(`${modelRow(2)} button.remove-model`);
  check(await page.locator('#c-model-limits .model-limit').count() === 1, 'Remove takes the row out');
  // Past the service's maximum: its 422 beside the model's field.
  await page.fill(`${modelRow(1)} input[name$="-exclusive_gpus"]`, '10000000000000000');
  await page.click('#cohort-submit');
  const modelTooHigh = await page.waitForSelector(`${modelRow(1)} [data-error-for$="-exclusive_gpus"]:not(:empty)`);
  check(/maximum/.test(await modelTooHigh.textContent()), `a model's limit too high is refused: ${await modelTooHigh.textContent()}`);
  check(await cell(`${member('lab', 'alpha')} .borrowing-limit`) === '≤ 1 exclusive GPU', 'the refused terms changed nothing');
  await page.fill(`${modelRow(1)} input[name$="-exclusive_gpus"]`, '');
  await page.click('#cohort-submit');
  await page.waitForFunction((sel) => document.querySelector(sel)?.textContent === '≤ 1 exclusive GPU; A100: ≤ 0 cGPUs',
    `${member('lab', 'alpha')} .borrowing-limit`);
  check(await cell(`${member('lab', 'beta')} .lending-limit`) === '≤ 1 exclusive GPU', 'beta kept its terms');
  // Edit shows the model's limits again.
  await page.click(`${member('lab', 'beta')} button.edit-member`);
  check(await page.locator('#c-model-limits .model-limit').count() === 0, 'beta has no row per model');
  await page.click(`${member('lab', 'alpha')} button.edit-member`);
  check(await page.inputValue(`${modelRow(1)} input.model-name`) === 'A100', 'Edit fills the model');
  check(await page.inputValue(`${modelRow(1)} input[name$="-cgpus"]`) === '0', 'Edit fills the model\'s limit');
  check(await page.inputValue(`${modelRow(1)} input[name$="-memory_mib"]`) === '', 'Edit leaves the model\'s other limits blank');
  // Another admin changes beta while this page saves alpha (between its read and its write):
  // the page's write is refused (409 version_conflict), it reads again and saves alpha on what is there now, so
  // beta's change stays.
  const labPath = `${base}/v1/cohorts/lab`;
  let puts = 0;
  await page.route('**/v1/cohorts/lab', async (route) => {
    if (route.request().method() === 'PUT' && puts++ === 0) {
      const auth = { Authorization: `Bearer ${adminToken}`, 'Content-Type': 'application/json' };
      const lab = await (await fetch(labPath, { headers: auth })).json();
      const members = Object.fromEntries(Object.entries(lab.members).map(([p, m]) => [p, m.terms]));
      members.beta.lending_limit.cgpus = 3;
      const put = await fetch(labPath, { method: 'PUT', headers: { ...auth, 'If-Match': `"${lab.version}"` },
        body: JSON.stringify({ members }) });
      check(put.status === 200, `the other admin's change: ${put.status}`);
    }
    await route.continue();
  });
  await page.fill(`${modelRow(1)} input[name$="-cgpus"]`, '1');
  await page.click('#cohort-submit');
  await page.waitForFunction((sel) => document.querySelector(sel)?.textContent === '≤ 1 exclusive GPU; A100: ≤ 1 cGPU',
    `${member('lab', 'alpha')} .borrowing-limit`);
  check(puts === 2, `the page wrote again after the conflict: ${puts} PUTs`);
  check(await cell(`${member('lab', 'beta')} .lending-limit`) === '≤ 3 cGPUs, ≤ 1 exclusive GPU',
    `the other admin's change stays: ${await cell(`${member('lab', 'beta')} .lending-limit`)}`);
  await page.unroute('**/v1/cohorts/lab');
  log('alpha borrows no cGPU of an A100');

  // Another cohort: delta joins it and is taken out again, then it is deleted.
  await saveCohort({ name: 'other', project: 'delta' });
  await page.waitForSelector(member('other', 'delta'));
  await page.click(`${member('other', 'delta')} button.remove-member`);
  await page.waitForSelector(member('other', 'delta'), { state: 'detached' });
  check(await page.locator(member('other', 'gamma')).count() === 1, 'gamma stays when delta is taken out');
  await page.click(`${cohort('other')} button.delete-cohort`);
  await page.waitForSelector(cohort('other'), { state: 'detached' });
  check(await page.locator('#cohorts .cohort').count() === 1, 'lab is the one cohort left');
  log('lab holds alpha and beta; delta was taken out of other, and other deleted');
  await signOut();

  // The tenant: no Cohorts section, its quota card names the cohort.
  tenantSignedIn = true;
  await signIn(tenantToken);
  check((await page.textContent('.who')).includes('tenant'), 'signed in as a tenant');
  const quota = '.quota[data-project="alpha"]';
  await page.waitForSelector(`${quota} .badge.cohort`);
  check(await cell(`${quota} .badge.cohort`) === 'cohort lab', 'the quota card names the cohort');
  check(await cell(`${quota} .quota-borrowed`) === 'Nothing borrowed from cohort lab now', 'nothing borrowed yet');
  check(await page.isHidden('#cohorts-section'), 'a tenant sees no Cohorts section');
  check(await page.locator('#cohorts .cohort').count() === 0, 'a tenant\'s page lists no cohort');

  // Two whole GPUs on a quota of one: refused when not borrowing, admitted when borrowing.
  const launch = async (name, borrow) => {
    await page.fill('#f-name', name);
    await page.fill('#f-image', 'cirros-0.6.2');
    await page.fill('#f-flavor', 'm1.small');
    await page.fill('#f-ncgpus', '2');
    await page.selectOption('#f-mode', 'exclusive');
    await page.fill('#f-gpu_memory_mib', '');
    await page.selectOption('#f-borrow', borrow);
    await page.click('#launch-submit');
  };
  await launch('dash-borrower', 'false');
  const overQuota = await page.waitForSelector('#launch-error:not(:empty)');
  check(/Over quota: .*exclusive/.test(await overQuota.textContent()), `not borrowing is refused: ${await overQuota.textContent()}`);
  check(await page.locator('.vm').count() === 0, 'the refused launch launched nothing');
  await launch('dash-borrower', 'true');
  const card = await page.waitForSelector('.vm[data-vm-name="dash-borrower"]');
  result.borrower = await card.getAttribute('data-vm-id');
  const vm = `.vm[data-vm-id="${result.borrower}"]`;
  await page.waitForSelector(`${vm}[data-state="ready"]`);
  check(await page.locator('#launch-error:not(:empty)').count() === 0, 'the over-quota error is cleared');
  await page.waitForSelector(`${vm} .cgpu[data-index="1"] .badge.borrowed`);
  check(await page.locator(`${vm} .cgpu[data-index="0"] .badge.borrowed`).count() === 0, 'the cGPU within the quota is not marked');
  check(await page.locator(`${vm} .badge.borrowed`).count() === 1, 'one cGPU is on loan');
  await page.waitForFunction((sel) => document.querySelector(sel)?.textContent.startsWith('Borrowed'), `${quota} .quota-borrowed`);
  check(/^Borrowed from cohort lab now: .*1 exclusive GPU$/.test(await cell(`${quota} .quota-borrowed`)),
    `the quota card counts the loan: ${await cell(`${quota} .quota-borrowed`)}`);
  check(await page.isHidden('#cohorts-section'), 'a tenant still sees no Cohorts section');
  check(tenantCohortRequests.length === 0, `a tenant's page asked for cohorts: ${tenantCohortRequests}`);
  const text = await page.innerText('body');
  for (const junk of ['[object', 'undefined', 'NaN', 'null']) check(!text.includes(junk), `the tenant's page shows ${junk}`);
  log(`${result.borrower} borrows its second cGPU`);
  await signOut();
  tenantSignedIn = false;

  // The admin sees the loan in the cohort.
  await signIn(adminToken);
  await page.waitForFunction((sel) => document.querySelector(sel)?.textContent === '1 exclusive GPU',
    `${member('lab', 'alpha')} .member-borrowed`);
  check(await cell(`${member('lab', 'beta')} .member-lendable`) === '1 exclusive GPU', 'beta still lends one GPU');
  await page.mouse.move(0, 0);
  await page.locator('#cohorts-section').screenshot({ path: join(shots, 'dashboard-cohorts.png') });

  if (problems.length) throw new Error(problems.join('\n'));
} catch (e) {
  failed = true;
  console.error(`cohorts: FAILED: ${e.stack || e}`);
  for (const p of problems) console.error(`cohorts: also: ${p}`);
  try {
    const failure = join(shots, 'cohorts-failure.png');
    await page.screenshot({ path: failure, fullPage: true });
    console.error(`cohorts: screenshot at failure: ${failure}`);
    console.error(`cohorts: page text at failure:\n${await page.innerText('body')}`);
  } catch {
    // the page itself is gone
  }
} finally {
  await close().catch(() => {});
}
if (failed) process.exit(1);
log('all checks passed');
console.log(`RESULT ${JSON.stringify(result)}`);
