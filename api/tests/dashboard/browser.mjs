// Drives the gsaasd dashboard in a real, headless Debian chromium through playwright-core (no
// browser download). api/tests/dashboard.rs starts gsaasd and runs this with:
//   GSAAS_URL             the service's base URL
//   GSAAS_TENANT_TOKEN    a member token, GSAAS_ADMIN_TOKEN an admin token
//   GSAAS_HIDDEN          JSON array of strings a tenant must never see (host names, rCUDA endpoints)
//   GSAAS_DRAIN_HOST      the host the admin drains
//   GSAAS_SCREENSHOTS     where dashboard-pool.png, dashboard-vm.png, dashboard-elastic.png and
//                         dashboard-queue.png go
//   CHROMIUM              the browser (default /usr/bin/chromium)
// Every wait is bounded; any failed check, page error or CSP violation exits non-zero. The last
// line on success is `RESULT {...}` with the ids of what it did, for the Rust side to check.
import { join } from 'node:path';
import { bound, check, need, openPage } from './chromium.mjs';

const WAIT_MS = 20000;
const OVERALL_MS = 150000;

const base = need('GSAAS_URL').replace(/\/$/, '');
const origin = new URL(base).origin;
const tenantToken = need('GSAAS_TENANT_TOKEN');
const adminToken = need('GSAAS_ADMIN_TOKEN');
const hidden = JSON.parse(need('GSAAS_HIDDEN'));
const drainHost = need('GSAAS_DRAIN_HOST');
const shots = need('GSAAS_SCREENSHOTS');
if (!Array.isArray(hidden) || hidden.length === 0) throw new Error('GSAAS_HIDDEN must list what tenants must not see');
const log = bound('dashboard', OVERALL_MS);
// Nothing may be fetched from anywhere but gsaasd itself. API refusals the test provokes (401
// for a bad token, 403, 422, 507) are logged by Chromium as failed loads; any other error (a CSP
// violation, an exception) fails the test.
const { page, problems, close } = await openPage({
  origin, refusals: [401, 403, 422, 507], viewport: { width: 1280, height: 800 }, waitMs: WAIT_MS,
  shots,
});

const vmCard = (id) => `.vm[data-vm-id="${id}"]`;

async function signIn(token) {
  await page.fill('#token', token);
  await page.click('#signin-submit');
  await page.waitForSelector('#main-view:not([hidden])');
}

async function signOut() {
  await page.click('#sign-out');
  await page.waitForSelector('#signin-view:not([hidden])');
}

async function fillLaunch(fields) {
  const all = { name: '', image: 'cirros-0.6.2', flavor: 'm1.small', networks: '', user_data: '', ncgpus: '1',
    gpu_memory_mib: '', mode: 'exclusive', locality: 'any', policy: '', distinct_gpus: false, queue: false,
    priority: '0', preemptible: false, gpu_model: '', min_compute_capability: '', min_cuda_version: '',
    traits_required: '', traits_forbidden: '', traits_preferred: '', traits_avoid: '', network_same: '',
    network_strength: 'required', network_max_rtt_us: '', network_nearest: false, remoting: '', ...fields };
  for (const name of ['name', 'image', 'flavor', 'networks', 'user_data', 'ncgpus', 'gpu_memory_mib', 'policy',
    'gpu_model', 'min_compute_capability', 'min_cuda_version', 'traits_required', 'traits_forbidden',
    'traits_preferred', 'traits_avoid', 'network_same', 'network_max_rtt_us']) {
    await page.fill(`#f-${name}`, all[name]);
  }
  await page.selectOption('#f-network_strength', all.network_strength);
  await page.setChecked('#f-network_nearest', all.network_nearest);
  await page.selectOption('#f-mode', all.mode);
  await page.selectOption('#f-locality', all.locality);
  await page.selectOption('#f-remoting', all.remoting);
  await page.setChecked('#f-distinct_gpus', all.distinct_gpus);
  await page.setChecked('#f-queue', all.queue);
  await page.fill('#f-priority', all.priority);
  await page.setChecked('#f-preemptible', all.preemptible);
}

// Launches through the form and waits until the VM is ready; returns its id.
async function launch(fields) {
  await fillLaunch(fields);
  await page.click('#launch-submit');
  const card = await page.waitForSelector(`.vm[data-vm-name="${fields.name}"]`);
  const id = await card.getAttribute('data-vm-id');
  await page.waitForSelector(`${vmCard(id)}[data-state="ready"]`);
  log(`launched ${fields.name} (${id}) and it became ready`);
  return id;
}

// Nothing rendered from a missing or mistyped value.
async function assertCleanText(when) {
  const text = await page.innerText('body');
  for (const junk of ['[object', 'undefined', 'NaN', 'null']) check(!text.includes(junk), `the page shows ${junk} (${when})`);
}

async function assertTenantSeesNoLocations(when) {
  await assertCleanText(when);
  const html = await page.evaluate(() => document.documentElement.outerHTML);
  for (const secret of hidden) check(!html.includes(secret), `the tenant page shows ${secret} (${when})`);
  check(await page.locator('#pool-hosts .host').count() === 0, `tenant sees hosts (${when})`);
}

let failed = false;
const result = {};
try {
  await page.goto(`${base}/`);
  await page.waitForSelector('#signin-view:not([hidden])');

  // A bad token is refused with the service's reason.
  await page.fill('#token', 'not-a-token');
  await page.click('#signin-submit');
  await page.waitForSelector('#signin-error:not(:empty)');
  check(await page.isHidden('#main-view'), 'a bad token does not sign in');
  log(`bad token refused: ${await page.textContent('#signin-error')}`);

  // Tenant: totals only.
  await signIn(tenantToken);
  check((await page.textContent('.who')).includes('tenant'), 'signed in as a tenant');
  check(await page.locator('#pool-totals .tile').count() === 4, 'pool totals shown, no fragmentation to a tenant');
  await assertTenantSeesNoLocations('after sign-in');

  // An invalid value: the service's problem is shown beside the field, and nothing launches.
  await fillLaunch({ name: 'dash-one', ncgpus: '0', mode: 'shared', gpu_memory_mib: '2048' });
  await page.click('#launch-submit');
  const error = await page.waitForSelector('[data-error-for="ncgpus"]:not(:empty)');
  const errorText = await error.textContent();
  check(/at least 1/.test(errorText), `ncgpus error says why: ${errorText}`);
  check(await page.getAttribute('#f-ncgpus', 'aria-invalid') === 'true', 'ncgpus marked invalid');
  check(await page.locator('[data-error-for="image"]:not(:empty)').count() === 0, 'no error beside other fields');
  check(await page.locator('.vm').count() === 0, 'the invalid request launched nothing');
  log(`invalid ncgpus shown beside the field: ${errorText}`);

  // Every field at fault is shown at once, each beside its own field.
  await fillLaunch({ name: 'dash-one', ncgpus: '0', mode: 'shared', gpu_memory_mib: '0' });
  await page.click('#launch-submit');
  await page.waitForSelector('[data-error-for="gpu_memory_mib"]:not(:empty)');
  check(/at least 1/.test(await page.textContent('[data-error-for="ncgpus"]')), 'ncgpus shown beside its field');
  check(await page.getAttribute('#f-gpu_memory_mib', 'aria-invalid') === 'true', 'gpu_memory_mib marked invalid');
  check(await page.locator('.vm').count() === 0, 'the invalid request launched nothing');

  // A missing shared-mode memory is named too.
  await fillLaunch({ name: 'dash-one', ncgpus: '1', mode: 'shared' });
  await page.click('#launch-submit');
  await page.waitForSelector('[data-error-for="gpu_memory_mib"]:not(:empty)');
  check(await page.locator('[data-error-for="ncgpus"]:not(:empty)').count() === 0, 'the old error is cleared');

  // A trait that is no trait name, then a model no GPU is: each named beside its own field.
  await fillLaunch({ name: 'dash-one', traits_required: 'nvlink' });
  await page.click('#launch-submit');
  const traitError = await page.waitForSelector('[data-error-for="traits_required"]:not(:empty)');
  check(/nvlink/.test(await traitError.textContent()), 'the bad trait is named');
  check(await page.getAttribute('#f-traits_required', 'aria-invalid') === 'true', 'traits_required marked invalid');
  await fillLaunch({ name: 'dash-one', gpu_model: 'V100' });
  await page.click('#launch-submit');
  const modelError = await page.waitForSelector('[data-error-for="gpu_model"]:not(:empty)');
  check(/V100/.test(await modelError.textContent()), 'the missing model is named');
  // A network level no host has (the testbed's hosts have no topology): named beside its field.
  await fillLaunch({ name: 'dash-one', network_same: 'rack', network_strength: 'preferred' });
  await page.click('#launch-submit');
  const levelError = await page.waitForSelector('[data-error-for="network_same"]:not(:empty)');
  check(/rack/.test(await levelError.textContent()), 'the unknown level is named');
  // A remote-GPU layer no GPU of the testbed speaks: named beside its field.
  await fillLaunch({ name: 'dash-one', remoting: 'lupine' });
  await page.click('#launch-submit');
  const layerError = await page.waitForSelector('[data-error-for="remoting"]:not(:empty)');
  check(/speaks lupine/.test(await layerError.textContent()), 'the layer no GPU speaks is named');
  check(await page.locator('.vm').count() === 0, 'the refused requests launched nothing');

  // One shared cGPU through the form, to ready, with every stage timed.
  result.deleted = await launch({ name: 'dash-one', ncgpus: '1', mode: 'shared', gpu_memory_mib: '2048',
    gpu_model: 'NVIDIA Quadro M4000', min_compute_capability: '5.0', traits_avoid: 'CUSTOM_NVLINK',
    network_nearest: true });
  const card = vmCard(result.deleted);
  const asked = await page.textContent(card);
  check(asked.includes('NVIDIA Quadro M4000') && asked.includes('avoid CUSTOM_NVLINK') && asked.includes('nearest GPUs'),
    `the card shows what was asked: ${asked}`);
  check(await page.locator(`${card} .stage:not(.pending)`).count() === 7, 'all 6 stages and the total are timed');
  check(await page.locator(`${card} .cgpu`).count() === 1, 'one cGPU listed');
  check((await page.textContent(`${card} .cgpus`)).includes('100.127.'), 'the cGPU shows its masked endpoint');
  check((await page.textContent(`${card} .facts`)).includes('rCUDA'), 'the card names the VM\'s remote-GPU layer');
  await assertTenantSeesNoLocations('with a ready VM');
  await page.locator(card).screenshot({ path: join(shots, 'dashboard-vm.png') });

  // A second VM that stays, for the admin's view.
  result.kept = await launch({ name: 'jupyter', ncgpus: '2', mode: 'shared', gpu_memory_mib: '3072',
    policy: 'least-load-fit', distinct_gpus: true, networks: 'private', user_data: '#!/bin/sh\necho hello from the tenant' });
  await assertTenantSeesNoLocations('with two VMs');

  // The project's quota (set by the test: 100 cGPUs, 2 VMs): a bar per limit, and a third VM is
  // refused as over quota, naming the resource.
  const quotaRow = (resource) => `.quota[data-project="alpha"] .quota-row[data-resource="${resource}"]`;
  await page.waitForSelector(`${quotaRow('vms')}.full`);
  check(await page.textContent(`${quotaRow('vms')} .quota-text`) === '2 of 2', 'the VMs bar says 2 of 2');
  check(await page.textContent(`${quotaRow('cgpus')} .quota-text`) === '3 of 100', 'the cGPUs bar says 3 of 100');
  check((await page.textContent(`${quotaRow('memory_mib')} .quota-text`)).endsWith('no limit'), 'memory has no limit');
  // Per GPU model: a bar for the model's limit, which counts the model's cGPUs.
  const modelRow = '.quota[data-project="alpha"] .quota-model[data-model="NVIDIA Quadro M4000"] .quota-row[data-resource="cgpus"]';
  check(await page.textContent(`${modelRow} .quota-text`) === '3 of 80', `the model's bar says ${await page.textContent(`${modelRow} .quota-text`)}`);
  await fillLaunch({ name: 'dash-three', ncgpus: '1', mode: 'shared', gpu_memory_mib: '1024' });
  await page.click('#launch-submit');
  const overQuota = await page.waitForSelector('#launch-error:not(:empty)');
  check(/Over quota: .*vms/.test(await overQuota.textContent()), `over quota said: ${await overQuota.textContent()}`);
  check(await page.locator('.vm[data-vm-name="dash-three"]').count() === 0, 'the refused launch launched nothing');
  log(`a third VM is refused: ${await overQuota.textContent()}`);

  // Terminate the first: it goes through deleting to deleted.
  await page.click(`${card} button.terminate`);
  await page.waitForSelector(`${card}[data-state="deleted"]`);
  check(await page.locator(`${card} button.terminate`).count() === 0, 'a deleted VM has no terminate button');
  log(`terminated ${result.deleted}: deleted`);
  await assertTenantSeesNoLocations('after terminate');
  await page.screenshot({ path: join(shots, 'dashboard-tenant.png') });

  // Elastic cGPUs: the kept VM grows by one through the attach dialog, then gives up its first.
  const kept = vmCard(result.kept);
  const cgpuIn = (index) => `${kept} .cgpu[data-index="${index}"]`;
  const masked = (index) => page.textContent(`${cgpuIn(index)} code.masked`);
  const device = (index) => page.textContent(`${cgpuIn(index)} code.device`);
  await page.click(`${kept} button.attach`);
  await page.waitForSelector('#attach-dialog[open]');
  check((await page.textContent('#attach-vm')) === 'jupyter', 'the attach dialog names the VM');
  await page.fill('#a-ncgpus', '0');
  await page.click('#attach-submit');
  const attachError = await page.waitForSelector('#attach-form [data-error-for="ncgpus"]:not(:empty)');
  check(/at least 1/.test(await attachError.textContent()), `attach's ncgpus error says why: ${await attachError.textContent()}`);
  check(await page.getAttribute('#a-ncgpus', 'aria-invalid') === 'true', "attach's ncgpus marked invalid");
  // More whole GPUs than the pool has: 507, said, and nothing changes.
  await page.fill('#a-ncgpus', '64');
  await page.selectOption('#a-mode', 'exclusive');
  await page.fill('#a-gpu_memory_mib', '');
  await page.click('#attach-submit');
  const capacity = await page.waitForSelector('#attach-error:not(:empty)');
  check(/Not enough GPU capacity/.test(await capacity.textContent()), `507 said: ${await capacity.textContent()}`);
  check(await page.locator('#attach-form [data-error-for="ncgpus"]:not(:empty)').count() === 0, 'the old attach error is cleared');
  await assertTenantSeesNoLocations('with a refused attach');
  check(await page.locator(`${kept} .cgpu`).count() === 2, 'the refused attaches changed nothing');
  // One more shared cGPU, on a GPU the VM does not use yet: device 2, live.
  await page.fill('#a-ncgpus', '1');
  await page.selectOption('#a-mode', 'shared');
  await page.fill('#a-gpu_memory_mib', '3072');
  await page.setChecked('#a-distinct_gpus', true);
  await page.click('#attach-submit');
  await page.waitForSelector('#attach-dialog', { state: 'hidden' });
  await page.waitForSelector(`${cgpuIn(2)}[data-state="live"]`);
  check(await page.locator(`${kept} .cgpu[data-state="live"]`).count() === 3, 'three live cGPUs after the attach');
  check(await device(2) === 'RCUDA_DEVICE_2', `the new cGPU is device 2, not ${await device(2)}`);
  check((await masked(2)).startsWith('100.127.'), 'the new cGPU shows its masked endpoint');
  const endpointOf1 = await masked(1);
  log(`attached cGPU #2 to jupyter at ${await masked(2)}`);
  // Detach cGPU 0: cGPU 1 keeps its endpoint and is device 0 now.
  await page.click(`${cgpuIn(0)} button.detach`);
  await page.waitForSelector(cgpuIn(0), { state: 'detached' });
  await page.waitForSelector(`${kept} button.attach:not([disabled])`);
  check(await page.locator(`${kept} .cgpu`).count() === 2, 'two cGPUs after the detach');
  check(await device(1) === 'RCUDA_DEVICE_0' && await device(2) === 'RCUDA_DEVICE_1', 'the live cGPUs are renumbered from 0');
  check(await masked(1) === endpointOf1, 'cGPU 1 kept its masked endpoint');
  log('detached cGPU #0 from jupyter; #1 and #2 are devices 0 and 1');
  await assertTenantSeesNoLocations('after an attach and a detach');
  await page.locator(kept).screenshot({ path: join(shots, 'dashboard-elastic.png') });

  // The queue: a launch that does not fit waits, shows its place on its card and in the Queue
  // card, and a terminate cancels it.
  await fillLaunch({ name: 'dash-queued', ncgpus: '4', mode: 'exclusive', queue: true, priority: '5' });
  await page.click('#launch-submit');
  const queuedOk = await page.waitForSelector('#launch-ok:not(:empty)');
  check(/Queued: .*position 1/.test(await queuedOk.textContent()), `queued said: ${await queuedOk.textContent()}`);
  const queuedCard = await page.waitForSelector('.vm[data-vm-name="dash-queued"][data-state="queued"]');
  result.queued = await queuedCard.getAttribute('data-vm-id');
  const queued = vmCard(result.queued);
  check((await page.textContent(`${queued} .queue-note`)).includes('position 1'), 'the queued VM shows its place');
  await page.waitForSelector(`#queue-requests tr.queued-request[data-vm="${result.queued}"][data-kind="launch"]`);
  check((await page.textContent('#queue-lengths')).includes('priority 5: 1 waiting'), 'the queue counts it at priority 5');
  await page.click(`${queued} button.terminate`);
  await page.waitForSelector(`${queued}[data-state="deleted"]`);
  await page.waitForSelector('#queue-requests tr.queued-request', { state: 'detached' });
  log(`queued ${result.queued} at position 1, then cancelled it`);

  // A queued attach: with the idle GPUs taken, jupyter's attach of a whole GPU waits beside the
  // running VM, and starts by itself when they free; the VM's events say so.
  result.filler = await launch({ name: 'dash-filler', ncgpus: '2', mode: 'exclusive' });
  await page.click(`${kept} button.attach`);
  await page.waitForSelector('#attach-dialog[open]');
  await page.fill('#a-ncgpus', '1');
  await page.selectOption('#a-mode', 'exclusive');
  await page.fill('#a-gpu_memory_mib', '');
  await page.setChecked('#a-distinct_gpus', false);
  await page.setChecked('#a-queue', true);
  await page.click('#attach-submit');
  await page.waitForSelector('#attach-dialog', { state: 'hidden' });
  const waiting = await page.waitForSelector(`${kept} .waiting-item[data-kind="attach"]`);
  check((await waiting.textContent()).includes('position 1'), `the waiting attach shows its place: ${await waiting.textContent()}`);
  check(await page.locator(`${kept}[data-state="ready"] .cgpu[data-state="live"]`).count() === 2, 'the VM runs on as it was');
  await page.waitForSelector(`#queue-requests tr.queued-request[data-vm="${result.kept}"][data-kind="attach"]`);
  await assertTenantSeesNoLocations('with a queued attach');
  await page.evaluate(() => document.getElementById('queue-section').scrollIntoView());
  await page.screenshot({ path: join(shots, 'dashboard-queue.png') });
  await page.click(`${vmCard(result.filler)} button.terminate`);
  await page.waitForSelector(`${kept} .event[data-kind="attached"]`);
  await page.waitForSelector(`${kept} .waiting-item`, { state: 'detached' });
  await page.waitForFunction((card) => document.querySelectorAll(`${card} .cgpu[data-state="live"]`).length === 3, kept);
  const added = await page.evaluate((card) => Array.from(document.querySelectorAll(`${card} .cgpu`))
    .map((c) => c.dataset.index).find((i) => i !== '1' && i !== '2'), kept);
  log(`the queued attach started when dash-filler went: cGPU #${added}`);
  // Back to two cGPUs for what follows.
  await page.click(`${cgpuIn(added)} button.detach`);
  await page.waitForSelector(cgpuIn(added), { state: 'detached' });
  await page.waitForSelector(`${kept} button.attach:not([disabled])`);
  await page.waitForSelector(`${vmCard(result.filler)}[data-state="deleted"]`);
  await assertTenantSeesNoLocations('after the queue');

  // Usage: the project's cGPU-hours plotted per GPU model (read again when the range changes).
  await page.selectOption('#usage-range', 'month');
  await page.waitForSelector('#usage-plot svg rect[data-label]');
  const usageLabels = await page.evaluate(() => [...new Set(Array.from(
    document.querySelectorAll('#usage-plot rect'), (r) => r.dataset.label))]);
  check(usageLabels.includes('NVIDIA Quadro M4000') && !usageLabels.includes('alpha'),
    `the tenant's plot is per GPU model: ${usageLabels}`);
  check((await page.textContent('#usage-legend')).includes('cGPU-hours'), 'the legend counts cGPU-hours');
  check(/by GPU model/.test(await page.textContent('#usage-note')), 'the note says per model');
  await page.evaluate(() => document.getElementById('usage-section').scrollIntoView());
  await page.screenshot({ path: join(shots, 'dashboard-usage.png') });
  await assertTenantSeesNoLocations('with the usage plot');

  // Admin: every host with its GPU bars, a segment per VM; launch, drain.
  await signOut();
  await signIn(adminToken);
  check((await page.textContent('.who')).includes('admin'), 'signed in as admin');
  await page.waitForSelector('#pool-hosts .host');
  const hosts = await page.locator('#pool-hosts .host').count();
  const bars = await page.locator('#pool-hosts .gpu-bar').count();
  check(hosts >= 2 && bars >= 1, `admin sees hosts (${hosts}) and GPU bars (${bars})`);
  const fragments = await page.locator('#pool-totals .tile', { hasText: 'In fragments' }).textContent();
  check(/^In fragments\s*\d+\.\d\d GPUs of \d+\.\d\d free/.test(fragments.trim()),
    `the admin's pool card shows the fragmentation (${fragments})`);
  check(await page.locator(`.segment[data-vm="${result.kept}"]`).count() === 2,
    'the kept VM holds a segment on each of its two GPUs');
  check(await page.locator(`.segment[data-vm="${result.deleted}"]`).count() === 0, 'the deleted VM holds nothing');
  // The admin's usage plot: a line per project.
  await page.waitForSelector('#usage-plot rect[data-label="alpha"]');
  check(/by project/.test(await page.textContent('#usage-note')), 'the admin plot is per project');
  result.admin_vm = await launch({ name: 'ops-batch', ncgpus: '1', mode: 'exclusive' });
  await page.waitForSelector(`.segment[data-vm="${result.admin_vm}"]`);
  check(await page.locator('.gpu-bar.exclusive').count() === 1, 'the exclusive GPU is marked');

  // A tainted GPU says so on its card.
  const gpuId = await page.locator('#pool-hosts .gpu').first().getAttribute('data-gpu');
  const tainted = await fetch(`${base}/v1/gpus/${encodeURIComponent(gpuId)}/taint`, {
    method: 'POST', headers: { authorization: `Bearer ${adminToken}`, 'content-type': 'application/json' },
    body: JSON.stringify({ reason: 'fan failure' }) });
  check(tainted.status === 200, `tainting ${gpuId}: ${tainted.status}`);
  await page.waitForSelector(`.gpu[data-gpu="${gpuId}"] .badge.tainted`, { timeout: 15000 });
  check((await page.textContent(`.gpu[data-gpu="${gpuId}"] .gpu-condition`)).includes('fan failure'),
    'the taint shows its reason');
  await fetch(`${base}/v1/gpus/${encodeURIComponent(gpuId)}/untaint`, {
    method: 'POST', headers: { authorization: `Bearer ${adminToken}` } });
  await page.waitForSelector(`.gpu[data-gpu="${gpuId}"] .badge.tainted`, { state: 'detached', timeout: 15000 });

  // A partitioned GPU and its partitions say so (the host with them is drained: it adds no room).
  await page.waitForSelector('.gpu[data-gpu="mig0:gpu0"] .badge.partitioned');
  check((await page.textContent('.gpu[data-gpu="mig0:gpu0"] .gpu-condition')).includes('2 partitions'),
    'the partitioned GPU counts its partitions');
  check((await page.textContent('.gpu[data-gpu="mig0:gpu101"] .badge.partition')) === '3g.40gb of mig0:gpu0',
    'a partition names its profile and parent');

  const host = `.host[data-host="${drainHost}"]`;
  await page.click(`${host} button.drain`);
  await page.waitForSelector(`${host}[data-state="drained"] .badge.state.drained`);
  check(await page.locator(`${host} button.undrain`).count() === 1, 'a drained host offers undrain');
  log(`drained ${drainHost}`);
  result.drained = drainHost;

  await assertCleanText('admin view');
  await page.mouse.move(0, 0);
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: join(shots, 'dashboard-pool.png') });

  if (problems.length) throw new Error(problems.join('\n'));
} catch (e) {
  failed = true;
  console.error(`dashboard: FAILED: ${e.stack || e}`);
  for (const p of problems) console.error(`dashboard: also: ${p}`);
  try {
    const failure = join(shots, 'dashboard-failure.png');
    await page.screenshot({ path: failure, fullPage: true });
    console.error(`dashboard: screenshot at failure: ${failure}`);
    console.error(`dashboard: page text at failure:\n${await page.innerText('body')}`);
  } catch {
    // the page itself is gone
  }
} finally {
  await close().catch(() => {});
}
if (failed) process.exit(1);
log('all checks passed');
console.log(`RESULT ${JSON.stringify(result)}`);
