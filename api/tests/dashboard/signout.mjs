// A sign-out that Keystone cannot complete, in a real, headless Debian chromium (playwright-core),
// against a gsaasd in Keystone mode on a fake Keystone whose revocations fail until the Rust side
// (api/tests/dashboard.rs, a_sign_out_...) lets them through. It runs with:
//   GSAAS_URL            gsaasd's base URL
//   GSAAS_SCREENSHOTS    where dashboard-signout-retrying.png goes
//   CHROMIUM             the browser (default /usr/bin/chromium)
// It signs in as alice (password `right`, project `demo`), signs out, sees the page say that
// signing out is not finished, and waits until the page's retries finished it. Every wait is
// bounded; the last line on success is `RESULT {"tokens": [...]}`: the Keystone tokens the page
// used.
import { join } from 'node:path';
import { bound, check, need, openPage } from './chromium.mjs';

const WAIT_MS = 30000;
const OVERALL_MS = 90000;

const base = need('GSAAS_URL').replace(/\/$/, '');
const shots = need('GSAAS_SCREENSHOTS');
const log = bound('signout', OVERALL_MS);
// The failed revocations are logged by Chromium as failed loads (503), and so is a refresh that
// raced the sign-out (401).
const { page, problems, close } = await openPage({
  origin: new URL(base).origin, refusals: [401, 503], viewport: { width: 1280, height: 800 },
  waitMs: WAIT_MS, shots,
});
const tokens = new Set();
page.on('request', (request) => {
  const token = request.headers()['x-auth-token'];
  if (token) tokens.add(token);
});

let failed = false;
try {
  await page.goto(`${base}/`);
  await page.waitForSelector('#keystone-form:not([hidden])');
  await page.fill('#ks-user', 'alice');
  await page.fill('#ks-password', 'right');
  await page.fill('#ks-project', 'demo');
  await page.click('#keystone-submit');
  await page.waitForSelector('#main-view:not([hidden])');
  log(`signed in: ${tokens.size} tokens used`);

  await page.click('#sign-out');
  await page.waitForSelector('#keystone-form:not([hidden])');
  await page.waitForSelector('#signout-status:not([hidden])');
  const said = await page.textContent('#signout-status');
  check(said.includes('Signing out is not finished') && said.includes('HTTP 503'), `the page says: ${said}`);
  await page.screenshot({ path: join(shots, 'dashboard-signout-retrying.png') });
  log(`the failed sign-out is shown: ${said}`);

  await page.waitForSelector('#signout-status', { state: 'hidden' });
  log('the retries finished it');
  check(problems.length === 0, `problems:\n${problems.join('\n')}`);
} catch (e) {
  failed = true;
  console.error(`signout: FAILED: ${e.stack || e}`);
  for (const p of problems) console.error(`signout: ${p}`);
  try {
    await page.screenshot({ path: join(shots, 'signout-failure.png') });
  } catch {}
} finally {
  await close();
}
if (failed) process.exit(1);
console.log(`RESULT ${JSON.stringify({ tokens: Array.from(tokens) })}`);
