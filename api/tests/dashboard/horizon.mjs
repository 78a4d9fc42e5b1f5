// GSaaS's panels in a real Horizon, in a real headless Debian chromium (playwright-core).
// tests/openstack_clients.rs starts gsaasd (where the catalog says it is) and Horizon (with
// horizon-plugin/ enabled) on the dev cloud, and runs this with:
//   HORIZON_URL                 Horizon's base URL
//   TENANT_USER, TENANT_PASSWORD  a member of a project (Project > GPUs)
//   ADMIN_USER, ADMIN_PASSWORD    an admin (Admin > GPUs)
//   IMAGE, FLAVOR                 what the launch form picks
//   DRAIN_HOST, TAINT_GPU         what the admin drains and taints
//   SCREENSHOTS                   where horizon-*.png go
//   CHROMIUM                      the browser (default /usr/bin/chromium)
// Every wait is bounded; the last line on success is `RESULT {"vm": id}`.
import { join } from 'node:path';
import { bound, check, need, openPage } from './chromium.mjs';

const WAIT_MS = 60000;
const OVERALL_MS = 300000;

const base = need('HORIZON_URL').replace(/\/$/, '');
const shots = need('SCREENSHOTS');
const log = bound('horizon', OVERALL_MS);
// Horizon loads its own assets, all from itself.
const { page, problems, close } = await openPage({
  origin: new URL(base).origin, viewport: { width: 1400, height: 900 }, waitMs: WAIT_MS, shots,
});

async function signIn(user, password, next) {
  await page.goto(`${base}/auth/login/?next=${encodeURIComponent(next)}`);
  await page.fill('#id_username', user);
  await page.fill('#id_password', password);
  await Promise.all([page.waitForNavigation(), page.click('#loginBtn')]);
  check(new URL(page.url()).pathname === next, `signed in to ${page.url()}, not ${next}`);
  log(`signed in as ${user} at ${next}`);
}

// Horizon's user menu: Sign Out (a POST), from the user settings page: a table that still polls
// its rows (a VM being deleted) can answer a poll begun before the sign-out after it, and Django
// then saves the session back, signed in (a race in Horizon, not in gsaasd; a CI run hit it).
async function signOut() {
  await page.goto(`${base}/settings/`);
  await page.click('.user-menu .dropdown-toggle');
  const button = page.locator('.user-menu form button[type=submit]');
  await button.waitFor({ state: 'visible' });
  await button.click();
  // Horizon answers the sign-out with its sign-in page.
  await page.waitForSelector('#id_username');
  log('signed out');
}

// Confirms Horizon's "are you sure" modal of a batch action.
async function confirm() {
  const modal = page.locator('.modal.in, .modal.show').last();
  await modal.waitFor();
  await modal.locator('.btn-danger, .btn-primary').last().click();
}

const rowOf = (table, id) => page.locator(`#${table} tr[data-object-id="${id}"]`);
let failed = false;
const result = {};
try {
  // ---- A tenant: Project > GPUs ----
  await signIn(need('TENANT_USER'), need('TENANT_PASSWORD'), '/project/gpus/');
  await page.waitForSelector('#vms');
  check(await page.locator('#gsaas-quota [data-quota="cgpus"]').count() === 1, 'quota bars shown');
  const nav = await page.textContent('#sidebar-accordion, .nav-sidebar, body');
  check(nav.includes('GPUs') && nav.includes('VMs with GPUs'), 'the GPUs panel group is in the navigation');

  await page.click('#vms__action_launch');
  const form = page.locator('form:has(#id_ncgpus)');
  await form.waitFor();
  await page.fill('#id_name', 'horizon-vm');
  await page.selectOption('#id_image', need('IMAGE'));
  await page.selectOption('#id_flavor', need('FLAVOR'));
  await page.fill('#id_ncgpus', '2');
  await page.selectOption('#id_mode', 'shared');
  await page.fill('#id_gpu_memory_mib', '1024');
  await page.screenshot({ path: join(shots, 'horizon-launch.png') });
  await form.locator('[type=submit]').click();
  const row = page.locator('#vms tbody tr', { hasText: 'horizon-vm' });
  await row.waitFor();
  const vm = await row.getAttribute('data-object-id');
  result.vm = vm;
  log(`launched horizon-vm (${vm})`);
  // The row follows the VM until it is ready (Horizon's row polling).
  await page.waitForFunction((id) => {
    const r = document.querySelector(`#vms tr[data-object-id="${id}"]`);
    return r && r.textContent.includes('ready') && (r.textContent.match(/live/g) || []).length === 2;
  }, vm, { timeout: 120000, polling: 500 });
  log('horizon-vm is ready with 2 live cGPUs');
  await page.reload();
  await page.waitForSelector(`#vms tr[data-object-id="${vm}"]`);
  const used = await page.textContent('#gsaas-quota [data-quota="cgpus"] .gsaas-quota-text');
  check(/\b2\b/.test(used), `the cGPUs quota bar shows 2 used: ${used}`);
  await page.screenshot({ path: join(shots, 'horizon-project-gpus.png'), fullPage: true });

  // Grow it by a cGPU, then give back cGPU #0 (the rows of ready VMs are not polled: reload).
  async function untilRow(predicate, what) {
    const deadline = Date.now() + 60000;
    for (;;) {
      const text = await rowOf('vms', vm).textContent();
      if (predicate(text)) return;
      check(Date.now() < deadline, `${what}: ${text}`);
      await page.waitForTimeout(500);
      await page.reload();
    }
  }
  await page.click(`#vms__row_${vm}__action_attach`);
  await page.waitForSelector('form:has(#id_ncgpus) #id_ncgpus');
  await page.fill('#id_ncgpus', '1');
  await page.locator('form:has(#id_ncgpus) [type=submit]').click();
  await untilRow((t) => (t.match(/live/g) || []).length === 3 && t.includes('#2 live'), 'cGPU #2 attached');
  log('attached cGPU #2');
  await rowOf('vms', vm).locator('.dropdown-toggle').click();
  await page.click(`#vms__row_${vm}__action_detach`);
  await page.waitForSelector('#id_index');
  await page.selectOption('#id_index', '0');
  await page.locator('form:has(#id_index) [type=submit]').click();
  await untilRow((t) => !t.includes('#0 ') && (t.match(/live/g) || []).length === 2, 'cGPU #0 detached');
  log('detached cGPU #0');

  await rowOf('vms', vm).locator('.dropdown-toggle').click();
  await page.click(`#vms__row_${vm}__action_terminate`);
  await confirm();
  await page.waitForFunction((id) => {
    const r = document.querySelector(`#vms tr[data-object-id="${id}"]`);
    return !r || /deleting|deleted/.test(r.textContent);
  }, vm, { timeout: 120000, polling: 500 });
  log('terminated horizon-vm');
  await signOut();

  // ---- An operator: Admin > GPUs ----
  await signIn(need('ADMIN_USER'), need('ADMIN_PASSWORD'), '/admin/gpus/');
  await page.waitForSelector('#hosts');
  const host = need('DRAIN_HOST');
  const hostRow = rowOf('hosts', host);
  await hostRow.waitFor();
  // A batch action that is not a deletion asks no confirmation.
  await page.click(`#hosts__row_${host}__action_drain`);
  await page.waitForFunction((h) => {
    const r = document.querySelector(`#hosts tr[data-object-id="${h}"]`);
    return r && r.textContent.includes('drained');
  }, host);
  log(`drained ${host}`);
  const gpu = need('TAINT_GPU');
  const gpuRow = page.locator('tr', { hasText: gpu });
  await gpuRow.getByText('Taint GPU').click();
  await page.waitForSelector('#id_reason');
  await page.fill('#id_reason', 'fan noise');
  await page.locator('form:has(#id_reason) [type=submit]').click();
  await page.locator('tr', { hasText: gpu }).getByText('fan noise').waitFor();
  log(`tainted ${gpu}`);
  await page.screenshot({ path: join(shots, 'horizon-admin-gpus.png'), fullPage: true });
  check(problems.length === 0, `problems:\n${problems.join('\n')}`);
} catch (e) {
  failed = true;
  console.error(`horizon: FAILED: ${e.stack || e}`);
  for (const p of problems) console.error(`horizon: ${p}`);
  try {
    await page.screenshot({ path: join(shots, 'horizon-failure.png'), fullPage: true });
    console.error(`horizon: at ${page.url()}, screenshot ${join(shots, 'horizon-failure.png')}`);
  } catch {}
} finally {
  await close();
}
if (failed) process.exit(1);
console.log(`RESULT ${JSON.stringify(result)}`);
