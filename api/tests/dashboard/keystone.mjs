// The dashboard's Keystone sign-in in a real, headless Debian chromium (playwright-core), against
// a gsaasd in Keystone mode on the real Keystone of scripts/openstack-dev.sh. api/tests/dashboard.rs
// (keystone_sign_in_...) runs it with:
//   GSAAS_URL            gsaasd's base URL
//   GSAAS_USER           a member of GSAAS_PROJECT and GSAAS_OTHER_PROJECT, GSAAS_PASSWORD its password
//   GSAAS_OWN_VM         a VM of GSAAS_PROJECT; GSAAS_FOREIGN_VM one of another project
//   GSAAS_SCREENSHOTS    where dashboard-keystone-signin.png goes
//   CHROMIUM             the browser (default /usr/bin/chromium)
// It signs in with a wrong password and with an unknown project (each refused beside the form),
// then as the member: sees its project's VM only; switches project; signs out. Every wait is
// bounded; the last line on success is `RESULT {"tokens": [...]}`: every Keystone token the page
// used, which the Rust side checks are revoked.
import { join } from 'node:path';
import { bound, check, need, openPage } from './chromium.mjs';

const WAIT_MS = 20000;
const OVERALL_MS = 120000;

const base = need('GSAAS_URL').replace(/\/$/, '');
const user = need('GSAAS_USER');
const password = need('GSAAS_PASSWORD');
const project = need('GSAAS_PROJECT');
const otherProject = need('GSAAS_OTHER_PROJECT');
const ownVm = need('GSAAS_OWN_VM');
const foreignVm = need('GSAAS_FOREIGN_VM');
const shots = need('GSAAS_SCREENSHOTS');
const log = bound('keystone', OVERALL_MS);
// The browser talks to gsaasd only: never to Keystone. The refusals this test provokes are
// logged by Chromium as failed loads.
const { page, problems, close } = await openPage({
  origin: new URL(base).origin, refusals: [401, 403], viewport: { width: 1280, height: 800 },
  waitMs: WAIT_MS, shots,
});
const tokens = new Set();
page.on('request', (request) => {
  const token = request.headers()['x-auth-token'];
  if (token) tokens.add(token);
});
// The sign-out's revocations, as gsaasd answered them.
const revoked = [];
page.on('response', (response) => {
  const request = response.request();
  if (request.method() === 'DELETE' && new URL(request.url()).pathname === '/v1/auth/tokens') {
    revoked.push(response.status());
  }
});

const vmCard = (id) => `.vm[data-vm-id="${id}"]`;

async function signIn(fields) {
  await page.fill('#ks-user', fields.user);
  await page.fill('#ks-password', fields.password);
  await page.fill('#ks-project', fields.project || '');
  await page.click('#keystone-submit');
}

async function refusedWith(text, when) {
  await page.waitForFunction((t) => document.querySelector('#keystone-error').textContent.includes(t), text);
  check(await page.isVisible('#keystone-form'), `the form stays (${when})`);
  check(!(await page.isVisible('#main-view')), `no page behind the refusal (${when})`);
  const error = await page.textContent('#keystone-error');
  check(!error.includes(password), `the error repeats the password (${when})`);
  log(`${when}: refused beside the form: ${error}`);
}

let failed = false;
try {
  await page.goto(`${base}/`);
  await page.waitForSelector('#keystone-form:not([hidden])');
  check(await page.inputValue('#ks-domain') === 'Default', 'the default domain is filled in');

  await signIn({ user, password: `${password}-wrong`, project });
  await refusedWith('refused the user name, domain, password', 'a wrong password');
  await signIn({ user, password, project: 'no-such-project' });
  await refusedWith('no role in project no-such-project', 'an unknown project');
  await page.screenshot({ path: join(shots, 'dashboard-keystone-signin.png') });

  await signIn({ user, password, project });
  await page.waitForSelector('#main-view:not([hidden])');
  await page.waitForSelector(vmCard(ownVm));
  check(await page.locator(vmCard(foreignVm)).count() === 0, 'another project\'s VM is listed');
  const who = await page.textContent('#who');
  check(who.includes(`${user} @ ${project}`), `who says ${who}`);
  // The token is in memory only.
  const stored = await page.evaluate(() => JSON.stringify([sessionStorage, localStorage, document.cookie]));
  for (const token of tokens) check(!stored.includes(token), 'a Keystone token was stored');
  log(`signed in as ${user} in ${project}: its VM listed, the other project's not`);

  await page.waitForSelector('#project-switch:not([hidden])');
  const options = await page.locator('#project-select option').allTextContents();
  check(options.includes(otherProject) && options.includes(project), `projects offered: ${options}`);
  await page.selectOption('#project-select', { label: otherProject });
  await page.waitForFunction((p) => document.querySelector('#who').textContent.includes(`@ ${p}`), otherProject);
  await page.waitForSelector(vmCard(ownVm), { state: 'detached' });
  log(`switched to ${otherProject}: ${project}'s VM no longer listed`);

  await page.click('#sign-out');
  await page.waitForSelector('#keystone-form:not([hidden])');
  check(!(await page.isVisible('#main-view')), 'signed out, the page is gone');
  const deadline = Date.now() + WAIT_MS;
  while (revoked.length < tokens.size) {
    check(Date.now() < deadline, `revocations answered: ${revoked.length} of ${tokens.size}`);
    await page.waitForTimeout(100);
  }
  check(revoked.every((status) => status === 204), `revocations: ${revoked}`);
  log(`signed out: ${revoked.length} tokens revoked`);
  check(problems.length === 0, `problems:\n${problems.join('\n')}`);
} catch (e) {
  failed = true;
  console.error(`keystone: FAILED: ${e.stack || e}`);
  for (const p of problems) console.error(`keystone: ${p}`);
  try {
    await page.screenshot({ path: join(shots, 'keystone-failure.png') });
  } catch {}
} finally {
  await close();
}
if (failed) process.exit(1);
console.log(`RESULT ${JSON.stringify({ tokens: Array.from(tokens) })}`);
