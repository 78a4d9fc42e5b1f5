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
import { chromium } from 'playwright-core';
import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const WAIT_MS = 20000;
const OVERALL_MS = 120000;

function need(name) {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
}

const base = need('GSAAS_URL').replace(/\/$/, '');
const origin = new URL(base).origin;
const user = need('GSAAS_USER');
const password = need('GSAAS_PASSWORD');
const project = need('GSAAS_PROJECT');
const otherProject = need('GSAAS_OTHER_PROJECT');
const ownVm = need('GSAAS_OWN_VM');
const foreignVm = need('GSAAS_FOREIGN_VM');
const shots = need('GSAAS_SCREENSHOTS');
const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';
if (!existsSync(executablePath)) throw new Error(`no browser at ${executablePath} (apt-get install -y chromium)`);
mkdirSync(shots, { recursive: true });

const overall = setTimeout(() => {
  console.error(`keystone: FAILED: still running after ${OVERALL_MS / 1000} s`);
  process.exit(2);
}, OVERALL_MS);
overall.unref();

const log = (message) => console.log(`keystone: ${message}`);
function check(condition, message) {
  if (!condition) throw new Error(`check failed: ${message}`);
}

const problems = [];
const profile = mkdtempSync(join(tmpdir(), 'gsaas-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath,
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  viewport: { width: 1280, height: 800 },
  timeout: 60000,
});
context.setDefaultTimeout(WAIT_MS);
// The browser talks to gsaasd only: never to Keystone.
await context.route('**/*', (route) => {
  const url = route.request().url();
  if (url.startsWith('data:') || new URL(url).origin === origin) return route.continue();
  problems.push(`request off origin: ${url}`);
  return route.abort();
});
const page = context.pages()[0] || await context.newPage();
page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
page.on('console', (m) => {
  // The refusals this test provokes are logged by Chromium as failed loads.
  if (m.type() === 'error' && !/Failed to load resource: the server responded with a status of (401|403)/.test(m.text())) {
    problems.push(`console error: ${m.text()}`);
  }
});
const tokens = new Set();
page.on('request', (request) => {
  const token = request.headers()['x-auth-token'];
  if (token) tokens.add(token);
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
  await refusedWith('refused the user name, domain or password', 'a wrong password');
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
  log('signed out');
  check(problems.length === 0, `problems:\n${problems.join('\n')}`);
} catch (e) {
  failed = true;
  console.error(`keystone: FAILED: ${e.stack || e}`);
  for (const p of problems) console.error(`keystone: ${p}`);
  try {
    await page.screenshot({ path: join(shots, 'keystone-failure.png') });
  } catch {}
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
if (failed) process.exit(1);
console.log(`RESULT ${JSON.stringify({ tokens: Array.from(tokens) })}`);
