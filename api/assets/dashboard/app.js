// GSaaS dashboard: a plain client of the same-origin REST API (no framework, no build step).
// A pasted gsaasd token lives in sessionStorage (this tab only) and goes out as a Bearer header;
// a Keystone sign-in (through gsaasd: POST /v1/auth/tokens) keeps its tokens in this page's
// memory only and sends them as X-Auth-Token. Every piece of text from the API is put in the page
// with textContent, never parsed as HTML.
'use strict';

(() => {
  const TOKEN_KEY = 'gsaas.token';
  const REFRESH_MS = 2000;
  const KEEP_DELETED_MS = 60000;
  // Equation 5.1: T = check + GPU selection + VM creation + activation + deployment + RODVR.
  const STAGES = [
    ['check', 'Check'],
    ['gpu_selection', 'GPU selection'],
    ['vm_creation', 'VM creation'],
    ['vm_activation', 'VM activation'],
    ['vm_deployment', 'VM deployment'],
    ['rodvr_configuration', 'RODVR config'],
  ];
  // The usage plot is read less often than the rest: a report adds up lifetimes in the database.
  const USAGE_REFRESH_MS = 60000;
  // Each range's period and step: the last 24 hours by hour, the last 30 days by day (UTC).
  const USAGE_RANGES = {
    day: { step: 3600, steps: 24, unit: 'hour' },
    month: { step: 86400, steps: 30, unit: 'day' },
  };
  // While a VM's cGPUs change, the page follows it more closely.
  const CHANGING_REFRESH_MS = 400;
  const KINDS = { 'compute-gpu': 'compute-GPU', 'compute-rgpu': 'compute-rGPU' };
  const PALETTE = ['#4f46e5', '#0891b2', '#db2777', '#059669', '#d97706', '#7c3aed', '#dc2626',
    '#2563eb', '#65a30d', '#c026d3', '#0d9488', '#ea580c'];

  const state = {
    token: null,
    // GET /v1/auth: whether Keystone sign-in is offered.
    authMode: 'jwt',
    // The user chose to paste a gsaasd token although Keystone is offered.
    useToken: false,
    // A Keystone sign-in: the session, the user's projects, and every token it got (revoked at
    // sign-out).
    keystone: null,
    claims: {},
    admin: false,
    pool: null,
    vms: [],
    quotas: [],
    // GET /v1/cohorts (admins); null when the caller may not read them, and the section is hidden.
    cohorts: null,
    queue: { lengths: [], requests: [] },
    // GET /v1/usage with a step: the plot's report, its range and when it was read.
    usage: null,
    usageRange: 'day',
    usageAt: 0,
    // VMs terminated from this tab, followed until deleted and shown a while after.
    terminated: new Map(),
    // The VM the attach dialog is open for.
    attachTo: null,
    timer: null,
    generation: 0,
    lastOk: null,
  };

  const $ = (id) => document.getElementById(id);

  // el('div', {class: 'x', text: 'y', data: {k: 'v'}}, child, ...)
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === 'class') node.className = value;
      else if (key === 'text') node.textContent = value;
      else if (key === 'data') for (const [k, v] of Object.entries(value)) node.dataset[k] = v;
      else if (key === 'style') Object.assign(node.style, value);
      else if (key === 'on') for (const [k, v] of Object.entries(value)) node.addEventListener(k, v);
      else node.setAttribute(key, value === true ? '' : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // ---- API -------------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, problem) {
      super(problem.detail || problem.title || `HTTP ${status}`);
      this.status = status;
      this.problem = problem;
    }
  }

  async function api(method, path, body, headers) {
    const init = {
      method,
      headers: Object.assign(authHeader(), { Accept: 'application/json' }, headers),
      credentials: 'omit',
      cache: 'no-store',
    };
    if (body !== undefined) {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (e) {
      throw new ApiError(0, { title: 'Network error', detail: `gsaasd is unreachable (${e.message})` });
    }
    const text = await response.text();
    let data = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch {
        data = { detail: text };
      }
    }
    if (!response.ok) throw new ApiError(response.status, data || { title: response.statusText });
    return data;
  }

  function authHeader() {
    if (!state.token) return {};
    return state.keystone ? { 'X-Auth-Token': state.token } : { Authorization: `Bearer ${state.token}` };
  }

  function decodeClaims(token) {
    try {
      const part = token.split('.')[1].replace(/-/g, '+').replace(/_/g, '/');
      const json = decodeURIComponent(Array.from(atob(part), (c) =>
        `%${c.charCodeAt(0).toString(16).padStart(2, '0')}`).join(''));
      return JSON.parse(json);
    } catch {
      return {};
    }
  }

  function newKey() {
    if (crypto.randomUUID) return crypto.randomUUID();
    const b = crypto.getRandomValues(new Uint8Array(16));
    return Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
  }

  // ---- Formatting ------------------------------------------------------------------------------

  function gib(mib) {
    const g = mib / 1024;
    return `${g >= 10 || Number.isInteger(g) ? g.toFixed(0) : g.toFixed(1)} GiB`;
  }

  function mem(mib) {
    return mib >= 1024 ? gib(mib) : `${mib} MiB`;
  }

  function secs(s) {
    if (s === undefined || s === null) return '…';
    if (s < 0.001) return `${(s * 1000).toFixed(2)} ms`;
    if (s < 1) return `${(s * 1000).toFixed(0)} ms`;
    return `${s.toFixed(2)} s`;
  }

  function colorOf(id) {
    let h = 0;
    for (const c of id) h = (h * 31 + c.charCodeAt(0)) >>> 0;
    return PALETTE[h % PALETTE.length];
  }

  function clock(ms) {
    return new Date(ms).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false });
  }

  // ---- Session ---------------------------------------------------------------------------------

  // Ends a Keystone session: every token it got is revoked at Keystone (through gsaasd), even if
  // the page goes away meanwhile (keepalive). A revocation gsaasd or Keystone did not complete
  // (no answer, 429, 5xx) is shown on the sign-in page and tried again, later and later, until
  // it is done: the user must not take a session that lives on for one that ended.
  function endKeystoneSession() {
    const keystone = state.keystone;
    state.keystone = null;
    if (!keystone) return Promise.resolve();
    return Promise.all(keystone.tokens.map((token) => revokeUntilDone(token, 0)));
  }

  // Tokens of ended sessions whose revocation is still being retried, with the last answer.
  const unrevoked = new Map();
  const SIGN_OUT_RETRY_MAX_MS = 30000;

  async function revokeUntilDone(token, attempt) {
    let status = 0;
    try {
      const response = await fetch('/v1/auth/tokens', {
        method: 'DELETE', headers: { 'X-Auth-Token': token }, credentials: 'omit', cache: 'no-store',
        keepalive: true,
      });
      status = response.status;
    } catch (e) {
      status = 0;
    }
    // 204: revoked; 401, 404, 422: there is nothing to revoke (gone, or not Keystone's).
    if ([204, 401, 404, 422].includes(status)) {
      unrevoked.delete(token);
      showSignOutStatus();
      return;
    }
    const delay = Math.min(SIGN_OUT_RETRY_MAX_MS, 1000 * 2 ** attempt);
    unrevoked.set(token, { status, retryAt: Date.now() + delay });
    showSignOutStatus();
    await new Promise((resolve) => setTimeout(resolve, delay));
    return revokeUntilDone(token, attempt + 1);
  }

  function showSignOutStatus() {
    const banner = $('signout-status');
    if (unrevoked.size === 0) {
      banner.hidden = true;
      banner.textContent = '';
      return;
    }
    const [{ status, retryAt }] = unrevoked.values();
    const why = status ? `HTTP ${status}` : 'no answer';
    const seconds = Math.max(1, Math.round((retryAt - Date.now()) / 1000));
    banner.textContent = `Signing out is not finished: your session could not be ended yet (${why}). `
      + `It is tried again in ${seconds} s; keep this page open until this message goes.`;
    banner.hidden = false;
  }

  function showSignIn(message) {
    clearTimeout(state.timer);
    state.generation += 1;
    state.token = null;
    endKeystoneSession();
    sessionStorage.removeItem(TOKEN_KEY);
    $('main-view').hidden = true;
    $('session').hidden = true;
    $('signin-view').hidden = false;
    const keystone = state.authMode === 'keystone' && !state.useToken;
    $('keystone-form').hidden = !keystone;
    $('signin-form').hidden = keystone;
    $('token-alt').hidden = state.authMode !== 'keystone';
    if (keystone) {
      $('keystone-error').textContent = message || '';
      $('ks-password').value = '';
      $('ks-appcred-secret').value = '';
      const first = $('ks-password-fields').hidden ? $('ks-appcred-id') : $('ks-user');
      first.focus();
    } else {
      $('signin-error').textContent = message || '';
      $('token').setAttribute('aria-invalid', message ? 'true' : 'false');
      $('token').focus();
    }
  }

  // Signs in with a pasted gsaasd token.
  async function signIn(token) {
    state.keystone = null;
    state.token = token;
    state.claims = decodeClaims(token);
    state.admin = (state.claims.roles || []).includes('admin');
    if (!(await enter())) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    showWho(state.claims.project ? `project ${state.claims.project}` : (state.claims.sub || ''));
  }

  // Loads the page for the token now in state; false (the sign-in form shows why) if refused.
  async function enter() {
    state.pool = null;
    state.vms = [];
    state.usage = null;
    state.usageAt = 0;
    state.cohorts = null;
    $('cohorts-section').hidden = true;
    $('cohorts').replaceChildren();
    $('cohort-form').reset();
    $('c-model-limits').replaceChildren();
    clearFormErrors('cohort-form', 'cohort-error');
    $('cohort-ok').textContent = '';
    state.terminated.clear();
    state.generation += 1;
    const ok = await refresh();
    if (!ok) return false;
    $('signin-view').hidden = true;
    $('main-view').hidden = false;
    $('session').hidden = false;
    return true;
  }

  function showWho(text) {
    $('who').replaceChildren(
      el('span', { text }),
      el('span', { class: `role${state.admin ? ' admin' : ''}`, text: state.admin ? 'admin' : 'tenant' }),
    );
  }

  // POST /v1/auth/tokens, unauthenticated (a sign-in) or with a token of the session (a switch).
  async function keystoneSession(body, token) {
    const headers = { Accept: 'application/json', 'Content-Type': 'application/json' };
    if (token) headers['X-Auth-Token'] = token;
    let response;
    try {
      response = await fetch('/v1/auth/tokens', {
        method: 'POST', headers, body: JSON.stringify(body), credentials: 'omit', cache: 'no-store',
      });
    } catch (e) {
      throw new ApiError(0, { title: 'Network error', detail: `gsaasd is unreachable (${e.message})` });
    }
    const text = await response.text();
    let data = {};
    try {
      data = text ? JSON.parse(text) : {};
    } catch {
      data = { detail: text };
    }
    if (!response.ok) throw new ApiError(response.status, data);
    return data;
  }

  // Signs in with Keystone (the form's fields), then shows the page as that user in its project.
  async function signInKeystone() {
    const appcred = $('ks-password-fields').hidden;
    let body;
    if (appcred) {
      body = { application_credential: { id: $('ks-appcred-id').value.trim(), secret: $('ks-appcred-secret').value } };
    } else {
      body = { password: { user: $('ks-user').value.trim(), password: $('ks-password').value } };
      const domain = $('ks-domain').value.trim();
      if (domain) body.password.domain = domain;
      const project = $('ks-project').value.trim();
      if (project) body.project = domain ? { name: project, domain } : { name: project };
    }
    const submit = $('keystone-submit');
    submit.disabled = true;
    $('keystone-error').textContent = '';
    try {
      const session = await keystoneSession(body, false);
      // The unscoped root first: switching projects exchanges it; revoking it ends them all.
      const tokens = session.unscoped_token ? [session.unscoped_token, session.token] : [session.token];
      await startKeystone(session, tokens, session.unscoped_token || null);
    } catch (e) {
      const fields = (e.problem && e.problem.errors) || [];
      const detail = fields.length ? fields.map((f) => `${f.field}: ${f.detail}`).join('; ') : e.message;
      $('keystone-error').textContent = e.status === 429 ? `Slow down: ${detail}` : detail;
    } finally {
      submit.disabled = false;
      $('ks-password').value = '';
      $('ks-appcred-secret').value = '';
    }
  }

  async function startKeystone(session, tokens, root) {
    // Set before entering, so that a refusal there (which signs out) revokes these tokens too.
    state.keystone = { session, tokens, root, projects: [] };
    state.token = session.token;
    state.admin = session.admin;
    if (!(await enter())) return;
    // enter() may have signed out on a refusal: the session is gone then.
    if (!state.keystone) return;
    const user = session.user.name || session.user.id;
    const project = session.project.name || session.project.id;
    showWho(`${user} @ ${project}`);
    await loadProjects();
  }

  async function loadProjects() {
    const select = $('project-select');
    let projects = [];
    try {
      projects = (await api('GET', '/v1/auth/projects')).projects;
    } catch (e) {
      projects = [];
    }
    if (!state.keystone) return;
    state.keystone.projects = projects;
    const current = state.keystone.session.project.id;
    select.replaceChildren(...projects.map((p) => el('option', {
      value: p.id, text: p.name || p.id, selected: p.id === current,
    })));
    $('project-switch').hidden = projects.length < 2;
  }

  // Switches to another of the user's projects: a new token scoped to it (the old ones are kept
  // to be revoked at sign-out).
  async function switchProject(id) {
    if (!state.keystone) return;
    const { tokens, root } = state.keystone;
    try {
      const session = await keystoneSession({ project: { id } }, root || state.token);
      // The new token joins the session before anything can end it.
      tokens.push(session.token);
      await startKeystone(session, tokens, root);
    } catch (e) {
      if (!state.keystone) return;
      const banner = $('banner');
      banner.textContent = `Cannot switch project: ${e.message}`;
      banner.hidden = false;
      $('project-select').value = state.keystone.session.project.id;
    }
  }

  function signOut() {
    $('token').value = '';
    showSignIn('');
  }

  // ---- Refresh ---------------------------------------------------------------------------------

  async function refresh() {
    const generation = state.generation;
    clearTimeout(state.timer);
    try {
      const [pool, list, quotas, queue] = await Promise.all([api('GET', '/v1/pool'), api('GET', '/v1/vms'),
        api('GET', '/v1/quotas'), api('GET', '/v1/queue')]);
      const listed = new Set(list.vms.map((vm) => vm.id));
      const now = Date.now();
      await Promise.all(Array.from(state.terminated.entries(), async ([id, entry]) => {
        if (listed.has(id)) return;
        if (entry.vm.state === 'deleted') {
          if (now - entry.since > KEEP_DELETED_MS) state.terminated.delete(id);
          return;
        }
        try {
          const vm = await api('GET', `/v1/vms/${encodeURIComponent(id)}`);
          state.terminated.set(id, { vm, since: now });
        } catch (e) {
          if (e.status === 404) state.terminated.delete(id);
          else throw e;
        }
      }));
      // Cohorts are the operators': asked for only when the pool says the caller is one.
      const cohorts = Array.isArray(pool.hosts) ? await readCohorts() : null;
      if (generation !== state.generation) return false;
      state.cohorts = cohorts;
      state.pool = pool;
      state.vms = list.vms;
      state.quotas = quotas.quotas;
      state.queue = queue;
      state.admin = Array.isArray(pool.hosts);
      state.lastOk = now;
      $('banner').hidden = true;
      render();
      schedule(generation);
      if (now - state.usageAt > USAGE_REFRESH_MS) refreshUsage(generation);
      return true;
    } catch (e) {
      if (generation !== state.generation) return false;
      if (e.status === 401) {
        showSignIn(`Token refused: ${e.message}`);
        return false;
      }
      if (!state.pool) {
        showSignIn(`Cannot sign in: ${e.message}`);
        return false;
      }
      const banner = $('banner');
      banner.textContent = `Refresh failed: ${e.message}. Retrying…`;
      banner.hidden = false;
      $('refresh').classList.add('stale');
      schedule(generation);
      return false;
    }
  }

  // Every cohort, or null when the caller may not read them (a policy that shows hosts to
  // someone who is no admin of cohorts).
  async function readCohorts() {
    try {
      return (await api('GET', '/v1/cohorts')).cohorts;
    } catch (e) {
      if (e.status === 403 || e.status === 404) return null;
      throw e;
    }
  }

  // The usage report of the range shown: the caller's project per GPU model, or (admins) the
  // projects that used the most. A failure leaves the last plot and says so beside it.
  async function refreshUsage(generation) {
    const range = USAGE_RANGES[state.usageRange];
    const now = Date.now();
    const end = Math.ceil(now / (range.step * 1000)) * range.step * 1000;
    const start = end - range.steps * range.step * 1000;
    state.usageAt = now;
    const query = `start=${encodeURIComponent(new Date(start).toISOString())}`
      + `&end=${encodeURIComponent(new Date(end).toISOString())}&step=${range.step}`;
    try {
      const usage = await api('GET', `/v1/usage?${query}`);
      if (generation !== state.generation) return;
      state.usage = usage;
      renderUsage();
    } catch (e) {
      if (generation !== state.generation) return;
      $('usage-note').textContent = `Cannot read usage: ${e.message}`;
    }
  }

  function svg(tag, attrs, ...children) {
    // The SVG namespace, from the page's own plot (an <svg> the HTML parser put in it).
    const node = document.createElementNS($('usage-svg').namespaceURI, tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === 'data') for (const [k, v] of Object.entries(value)) node.dataset[k] = v;
      else node.setAttribute(key, String(value));
    }
    for (const child of children.flat(Infinity)) if (child) node.append(child);
    return node;
  }

  function hours(seconds) {
    const h = seconds / 3600;
    return h >= 100 ? h.toFixed(0) : h >= 1 ? h.toFixed(1) : h.toFixed(3);
  }

  // Stacked bars: a bar per step, a segment per line (model or project), in cGPU-hours.
  function renderUsage() {
    const usage = state.usage;
    if (!usage) return;
    const series = usage.series || { lines: [], step_seconds: 3600, by: 'model' };
    const range = USAGE_RANGES[state.usageRange];
    const steps = series.lines.length ? series.lines[0].cgpu_seconds.length : range.steps;
    const totals = Array.from({ length: steps }, (_, i) =>
      series.lines.reduce((sum, line) => sum + (line.cgpu_seconds[i] || 0), 0));
    const top = Math.max(...totals, 1e-9);
    const [width, height, left, bottom] = [600, 160, 34, 16];
    const slot = (width - left) / steps;
    const bars = [];
    series.lines.forEach((line, n) => {
      const color = PALETTE[n % PALETTE.length];
      line.cgpu_seconds.forEach((value, i) => {
        if (!value) return;
        const below = series.lines.slice(0, n).reduce((sum, l) => sum + (l.cgpu_seconds[i] || 0), 0);
        const h = (value / top) * (height - bottom);
        const y = height - bottom - ((below / top) * (height - bottom)) - h;
        const from = new Date(usage.start_ms + i * series.step_seconds * 1000);
        bars.push(svg('rect', {
          x: (left + i * slot + 1).toFixed(1), y: y.toFixed(1), width: Math.max(slot - 2, 1).toFixed(1),
          height: Math.max(h, 0.5).toFixed(1), fill: color, data: { label: line.label, step: i },
        }, svg('title', {}, `${line.label}: ${hours(value)} cGPU-hours from ${from.toLocaleString()}`)));
      });
    });
    const axis = [
      svg('line', { class: 'axis', x1: left, y1: height - bottom, x2: width, y2: height - bottom }),
      svg('text', { x: 0, y: 10 }, `${hours(top)} h`),
      svg('text', { x: left, y: height - 3 }, new Date(usage.start_ms).toLocaleDateString()),
      svg('text', { x: width - 60, y: height - 3 }, range.unit === 'hour' ? 'now' : 'today'),
    ];
    const plot = $('usage-svg');
    plot.setAttribute('aria-label', `cGPU-hours per ${range.unit}, by ${series.by}`);
    plot.replaceChildren(...axis, ...bars);
    const byLabel = new Map(series.lines.map((line, n) =>
      [line.label, { n, seconds: line.cgpu_seconds.reduce((a, b) => a + b, 0) }]));
    $('usage-legend').replaceChildren(...(series.lines.length
      ? series.lines.map((line) => el('span', { class: 'usage-item', data: { label: line.label } },
        el('span', { class: 'usage-swatch', style: { background: PALETTE[byLabel.get(line.label).n % PALETTE.length] } }),
        el('span', { text: `${line.label}: ${hours(byLabel.get(line.label).seconds)} cGPU-hours` })))
      : [el('div', { class: 'empty', text: 'No cGPU was used in this period.' })]));
    const vmHours = usage.projects.reduce((sum, p) => sum + p.vm_seconds, 0);
    $('usage-note').textContent = series.by === 'project'
      ? `cGPU-hours per ${range.unit}, by project (the ${series.lines.length} that used the most) · ${hours(vmHours)} VM-hours in all`
      : `cGPU-hours per ${range.unit}, by GPU model · ${hours(vmHours)} VM-hours`;
  }

  function schedule(generation) {
    clearTimeout(state.timer);
    if (generation !== state.generation || document.hidden) return;
    const changing = state.vms.some((vm) => vm.cgpus.some((c) => c.state !== 'live'));
    state.timer = setTimeout(() => refresh(), changing ? CHANGING_REFRESH_MS : REFRESH_MS);
  }

  // ---- Rendering -------------------------------------------------------------------------------

  function render() {
    const refreshNote = $('refresh');
    refreshNote.classList.remove('stale');
    refreshNote.textContent = `updated ${clock(state.lastOk)} · every ${REFRESH_MS / 1000} s`;
    renderPool();
    renderQuotas();
    renderCohorts();
    renderQueue();
    renderVms();
  }

  function tile(label, value, sub, fraction) {
    return el('div', { class: 'tile' },
      el('div', { class: 'label', text: label }),
      el('div', { class: 'value' }, value, sub ? el('small', { text: ` ${sub}` }) : null),
      fraction === undefined ? null
        : el('div', { class: 'meter' }, el('span', { style: { width: `${Math.min(100, fraction * 100)}%` } })));
  }

  // Admins only: the free capacity no cGPU of the pool's mix could use, in GPUs.
  function fragmentationTile(fragmentation) {
    if (!fragmentation) return null;
    const { fragmented_gpus: lost, free_gpus: free } = fragmentation;
    return tile('In fragments', `${lost.toFixed(2)} GPUs`, `of ${free.toFixed(2)} free`,
      free > 0 ? lost / free : 0);
  }

  function renderPool() {
    const { totals, hosts } = state.pool;
    $('pool-totals').replaceChildren(...[
      tile('GPUs', String(totals.gpus), `(${totals.idle_gpus} idle)`),
      tile('cGPUs in use', String(totals.cgpus)),
      tile('GPU memory booked', gib(totals.allocated_mib), `of ${gib(totals.memory_mib)}`,
        totals.memory_mib ? totals.allocated_mib / totals.memory_mib : 0),
      tile('GPU memory free', gib(totals.memory_mib - totals.allocated_mib)),
      fragmentationTile(state.pool.fragmentation),
    ].filter(Boolean));
    $('pool-note').textContent = hosts
      ? `${hosts.length} hosts`
      : 'Totals only: where GPUs are is known to operators, not tenants.';
    $('pool-hosts').replaceChildren(...(hosts || []).map(renderHost));
  }

  // [resource, label, format] of each quota limit.
  const QUOTA_RESOURCES = [
    ['cgpus', 'cGPUs', String],
    ['memory_mib', 'GPU memory', mem],
    ['exclusive_gpus', 'Exclusive GPUs', String],
    ['vms', 'VMs', String],
  ];

  function renderQuotas() {
    const quotas = state.quotas;
    const n = quotas.length;
    $('quota-note').textContent = state.admin
      ? `${n} project${n === 1 ? '' : 's'} with limits of their own or cGPUs`
      : 'Your project: what it uses of each limit';
    $('quotas').replaceChildren(...(n ? quotas.map(renderQuota)
      : [el('div', { class: 'empty', text: 'No project has limits of its own or holds cGPUs.' })]));
  }

  // One resource's bar: what is used of its limit, if it has one.
  function quotaRow([key, label, format], used, limit) {
    const limited = typeof limit === 'number';
    const full = limited && used >= limit;
    return el('div', { class: `quota-row${full ? ' full' : ''}`, data: { resource: key } },
      el('span', { class: 'quota-label', text: label }),
      el('div', { class: 'meter', role: 'img', 'aria-label': `${label}: ${used} of ${limited ? limit : 'no limit'}` },
        limited ? el('span', { style: { width: `${limit > 0 ? Math.min(100, (used / limit) * 100) : 100}%` } }) : null),
      el('span', { class: 'quota-text', text: limited ? `${format(used)} of ${format(limit)}` : `${format(used)} · no limit` }));
  }

  // Per GPU model (those limited or held): cGPUs always, the other resources where limited.
  function renderModelQuotas(q) {
    const limits = q.limits.models || {};
    const usage = q.usage.models || {};
    const models = [...new Set([...Object.keys(limits), ...Object.keys(usage)])].sort();
    return models.map((model) => {
      const limit = limits[model] || {};
      const used = usage[model] || {};
      const rows = QUOTA_RESOURCES.filter(([key]) => key !== 'vms')
        .filter(([key]) => key === 'cgpus' || typeof limit[key] === 'number')
        .map((resource) => quotaRow(resource, used[resource[0]] || 0, limit[resource[0]]));
      return el('div', { class: 'quota-model', data: { model } },
        el('div', { class: 'quota-model-name', text: model }), rows);
    });
  }

  function renderQuota(q) {
    const rows = QUOTA_RESOURCES.map((resource) => quotaRow(resource, q.usage[resource[0]], q.limits[resource[0]]));
    return el('div', { class: 'quota', data: { project: q.project } },
      el('div', { class: 'quota-head' },
        el('span', { class: 'quota-project', text: `project ${q.project}` }),
        el('span', { class: 'quota-badges' },
          q.cohort ? el('span', { class: 'badge cohort', text: `cohort ${q.cohort}`,
            title: 'It may borrow past its limits on what the cohort\'s other members leave unused' }) : null,
          el('span', { class: 'badge', text: q.own_limits ? 'own limits' : 'defaults' }))),
      rows,
      renderModelQuotas(q),
      renderQuotaLoans(q),
      el('div', { class: 'quota-priority', text: `Highest priority: ${q.limits.max_priority}` }));
  }

  // What the project holds past its limits, on loan from its cohort (or from one it has left).
  function renderQuotaLoans(q) {
    const borrowed = amounts(q.borrowed || {});
    if (!q.cohort && !borrowed) return null;
    const text = q.cohort
      ? (borrowed ? `Borrowed from cohort ${q.cohort} now: ${borrowed}` : `Nothing borrowed from cohort ${q.cohort} now`)
      : `Held past its limits on loan from the cohort it has left: ${borrowed}`;
    return el('div', { class: `quota-borrowed${borrowed ? ' borrowing' : ''}`, text });
  }

  // ---- Cohorts (admins) ------------------------------------------------------------------------

  // The resources a cohort lends, as the API names them, with how to say an amount of each and
  // the label of the form's field for a limit of it.
  const LENT_RESOURCES = [
    ['cgpus', (n) => `${n} cGPU${n === 1 ? '' : 's'}`, 'cGPUs'],
    ['memory_mib', mem, 'GPU memory, MiB'],
    ['exclusive_gpus', (n) => `${n} exclusive GPU${n === 1 ? '' : 's'}`, 'Exclusive GPUs'],
  ];

  // The form's fields of one limit (`borrowing_limit`, `lending_limit`, a model's `model-N`):
  // `c-{which}-{resource}`, each with its error line.
  function limitFields(which) {
    return LENT_RESOURCES.map(([key, , label]) => el('div', { class: 'field' },
      el('label', { for: `c-${which}-${key}`, text: label }),
      el('input', { id: `c-${which}-${key}`, name: `${which}-${key}`, type: 'number', min: '0',
        inputmode: 'numeric', autocomplete: 'off' }),
      el('div', { class: 'field-error', data: { errorFor: `${which}-${key}` } })));
  }

  // Rows of the per-model borrowing limits are numbered as they are added, never reused.
  let modelRows = 0;

  // Adds a row of the per-model borrowing limits (a GPU model's name, its limits, a way to take
  // the row out), filled with `model` and `limits`; returns the row's field prefix.
  function addModelRow(model = '', limits = {}) {
    const which = `model-${modelRows++}`;
    const row = el('div', { class: 'model-limit', data: { row: which } },
      el('div', { class: 'model-limit-head' },
        el('div', { class: 'field' },
          el('label', { for: `c-${which}`, text: 'GPU model' }),
          el('input', { id: `c-${which}`, name: which, class: 'model-name', placeholder: 'H100',
            autocomplete: 'off', spellcheck: 'false' }),
          el('div', { class: 'field-error', data: { errorFor: which } })),
        el('button', { type: 'button', class: 'small remove-model', text: 'Remove',
          on: { click: () => row.remove() } })),
      el('div', { class: 'row3' }, limitFields(which)));
    $('c-model-limits').append(row);
    $(`c-${which}`).value = model;
    for (const [key] of LENT_RESOURCES) {
      $(`c-${which}-${key}`).value = typeof limits[key] === 'number' ? String(limits[key]) : '';
    }
    return which;
  }

  // Non-zero amounts of ModelQuotaUsage (`1 cGPU, 8 GiB`), or '' when all are zero.
  function amounts(usage) {
    return LENT_RESOURCES.filter(([key]) => usage[key] > 0).map(([key, say]) => say(usage[key])).join(', ');
  }

  // ModelQuotaLimits, where null is no limit.
  function limitsText(limits) {
    const set = LENT_RESOURCES.filter(([key]) => typeof (limits || {})[key] === 'number');
    return set.length ? set.map(([key, say]) => `≤ ${say(limits[key])}`).join(', ') : 'no limit';
  }

  // The borrowing limit in all, and per GPU model where the terms set one.
  function borrowingText(terms) {
    const byModel = Object.entries(terms.borrowing_limit_by_model || {})
      .map(([model, limits]) => `${model}: ${limitsText(limits)}`);
    return [limitsText(terms.borrowing_limit), ...byModel].join('; ');
  }

  function renderCohorts() {
    const cohorts = state.admin ? state.cohorts : null;
    $('cohorts-section').hidden = cohorts === null;
    if (cohorts === null) {
      // Nothing of an admin's view stays behind for whoever signs in next in this tab.
      $('cohorts').replaceChildren();
      return;
    }
    const n = cohorts.length;
    $('cohorts-note').textContent = n
      ? `${n} cohort${n === 1 ? '' : 's'}: members borrow past their quotas what the others leave unused`
      : 'Projects in a cohort lend each other the quota they leave unused';
    $('cohorts').replaceChildren(...(n ? cohorts.map(renderCohort)
      : [el('div', { class: 'empty', text: 'No cohort yet: every project stops at its quota. Put two projects in one below.' })]));
  }

  function renderCohort(cohort) {
    const members = Object.entries(cohort.members);
    const head = ['Project', 'Borrowing limit', 'Lending limit', 'By default', 'Borrowed now', 'Lendable now', ''];
    const rows = members.map(([project, m]) => el('tr', { class: 'cohort-member', data: { project } },
      el('td', { class: 'member-project', text: project }),
      el('td', { class: 'borrowing-limit', text: borrowingText(m.terms),
        title: 'How far past its quota it may run; a resource not named: as far as the others lend' }),
      el('td', { class: 'lending-limit', text: limitsText(m.terms.lending_limit),
        title: 'How much of its unused quota the others may borrow; a resource not named: all of it' }),
      el('td', { class: 'borrow-by-default', text: m.terms.borrow_by_default ? 'borrows' : 'when asked' }),
      el('td', { class: 'member-borrowed', text: amounts(m.borrowed) || 'nothing' }),
      el('td', { class: 'member-lendable', text: amounts(m.lendable) || 'nothing' }),
      el('td', { class: 'member-actions' },
        el('button', { type: 'button', class: 'small edit-member', text: 'Edit',
          on: { click: () => editMember(cohort.name, project, m.terms) } }),
        el('button', { type: 'button', class: 'small danger remove-member', text: 'Take out',
          on: { click: (e) => removeMember(cohort.name, project, e.target) } }))));
    return el('div', { class: 'cohort', data: { cohort: cohort.name } },
      el('div', { class: 'cohort-head' },
        el('span', { class: 'cohort-name', text: `cohort ${cohort.name}` }),
        el('span', { class: 'muted cohort-totals',
          text: `lends ${amounts(cohort.lendable) || 'nothing'} now · its members borrow ${amounts(cohort.borrowed) || 'nothing'}` }),
        el('span', { class: 'spacer' }),
        el('button', { type: 'button', class: 'small danger delete-cohort', text: 'Delete cohort',
          on: { click: (e) => deleteCohort(cohort.name, cohort.version, e.target) } })),
      el('table', { class: 'cohort-table' },
        el('thead', {}, el('tr', {}, head.map((h) => el('th', { text: h })))),
        el('tbody', {}, rows)));
  }

  const cohortPath = (name) => `/v1/cohorts/${encodeURIComponent(name)}`;

  // The cohort's members and their terms, as a PUT takes them ({} when there is no such cohort),
  // and the If-Match header that changes it only as read.
  async function readCohort(name) {
    try {
      const cohort = await api('GET', cohortPath(name));
      const members = Object.fromEntries(Object.entries(cohort.members).map(([project, m]) => [project, m.terms]));
      return { members, ifMatch: ifMatch(cohort.version) };
    } catch (e) {
      if (e.status === 404) return { members: {}, ifMatch: {} };
      throw e;
    }
  }

  // The header that makes a change of a cohort at `version` fail (409 version_conflict) if someone
  // changed it since.
  const changedMeanwhile = (e) => e.status === 409 && (e.problem || {}).code === 'version_conflict';
  function ifMatch(version) {
    return version ? { 'If-Match': `"${version}"` } : {};
  }

  // How often a member's change is made again on a cohort another admin changed meanwhile.
  const COHORT_TRIES = 5;

  // The form's cohort name, project and terms; null (each bad field marked) when it cannot be sent.
  function cohortForm() {
    const value = (name) => $(`c-${name}`).value.trim();
    const faults = [];
    for (const name of ['cohort', 'project']) {
      if (!value(name)) faults.push({ field: name, detail: `name the ${name}` });
    }
    const readLimits = (which) => Object.fromEntries(LENT_RESOURCES.map(([key]) => {
      const field = `${which}-${key}`;
      const text = value(field);
      // A number input holding what is no number reads as empty: it must not pass for "none".
      if ($(`c-${field}`).validity.badInput || (text !== '' && !/^\d+$/.test(text))) {
        faults.push({ field, detail: 'a whole number, or blank for none' });
      }
      return [key, text === '' ? null : Number(text)];
    }));
    // Per GPU model: a row with no model and no limit is left out.
    const byModel = {};
    for (const row of $('c-model-limits').querySelectorAll('.model-limit')) {
      const which = row.dataset.row;
      const model = value(which);
      const limits = readLimits(which);
      if (!model) {
        if (Object.values(limits).some((limit) => limit !== null)) {
          faults.push({ field: which, detail: 'name the GPU model these limits are of' });
        }
      } else if (Object.hasOwn(byModel, model)) {
        faults.push({ field: which, detail: `${model} has limits above already` });
      } else {
        byModel[model] = limits;
      }
    }
    const terms = {
      borrowing_limit: readLimits('borrowing_limit'),
      borrowing_limit_by_model: byModel,
      lending_limit: readLimits('lending_limit'),
      borrow_by_default: $('c-borrow_by_default').checked,
    };
    if (faults.length) {
      showProblem(new ApiError(0, { errors: faults }), 'cohort-form', 'c', 'cohort-error');
      return null;
    }
    return { cohort: value('cohort'), project: value('project'), terms };
  }

  // A refused PUT's field (`name`, `members.alpha.lending_limit.cgpus`,
  // `members.alpha.borrowing_limit_by_model.H100.cgpus`) to a field of the form.
  function cohortField(problem, project) {
    const field = problem.field || '';
    if (field === 'name') return 'cohort';
    const prefix = `members.${project}`;
    if (field === prefix) return 'project';
    if (!field.startsWith(`${prefix}.`)) return null;
    const rest = field.slice(prefix.length + 1);
    const limit = /^(borrowing_limit|lending_limit)\.([a-z_]+)$/.exec(rest);
    if (limit) return `${limit[1]}-${limit[2]}`;
    // A model's name may hold dots: the resource is what follows the last.
    const byModel = /^borrowing_limit_by_model\.(.+)\.([a-z_]+)$/.exec(rest);
    if (!byModel) return null;
    const row = [...$('c-model-limits').querySelectorAll('.model-limit')]
      .find((r) => trimmed(`c-${r.dataset.row}`) === byModel[1]);
    return row && LENT_RESOURCES.some(([key]) => key === byModel[2]) ? `${row.dataset.row}-${byModel[2]}` : null;
  }

  // The trimmed value of input `id`.
  function trimmed(id) {
    return $(id).value.trim();
  }

  // Puts the form's project in its cohort on the form's terms (a PUT replaces the members: the
  // others are sent as they are now).
  async function saveMember(event) {
    event.preventDefault();
    clearFormErrors('cohort-form', 'cohort-error');
    $('cohort-ok').textContent = '';
    const form = cohortForm();
    if (!form) return;
    const submit = $('cohort-submit');
    submit.disabled = true;
    try {
      // Read, change this member, write only if nobody changed the cohort meanwhile: another
      // admin's change of another member is never undone (and this one is made again on it).
      let joined = null;
      for (let tries = 0; joined === null; tries++) {
        const { members, ifMatch: unchanged } = await readCohort(form.cohort);
        const joining = !(form.project in members);
        // Terms the form has no field for (none now; a later API's) stay as they are.
        members[form.project] = { ...members[form.project], ...form.terms };
        try {
          await api('PUT', cohortPath(form.cohort), { members }, unchanged);
          joined = joining;
        } catch (e) {
          if (!changedMeanwhile(e) || tries + 1 >= COHORT_TRIES) throw e;
        }
      }
      $('cohort-ok').textContent = joined
        ? `Project ${form.project} is in cohort ${form.cohort} now.`
        : `Project ${form.project} has new terms in cohort ${form.cohort}.`;
      await refresh();
    } catch (e) {
      if (e.status === 401) {
        showSignIn(`Token refused: ${e.message}`);
        return;
      }
      showProblem(e, 'cohort-form', 'c', 'cohort-error', {
        fieldOf: (entry) => cohortField(entry, form.project), labels: { 409: 'In another cohort' },
      });
    } finally {
      submit.disabled = false;
    }
  }

  function editMember(cohort, project, terms) {
    clearFormErrors('cohort-form', 'cohort-error');
    $('cohort-ok').textContent = '';
    $('c-cohort').value = cohort;
    $('c-project').value = project;
    for (const which of ['borrowing_limit', 'lending_limit']) {
      for (const [key] of LENT_RESOURCES) {
        const limit = (terms[which] || {})[key];
        $(`c-${which}-${key}`).value = typeof limit === 'number' ? String(limit) : '';
      }
    }
    $('c-model-limits').replaceChildren();
    for (const [model, limits] of Object.entries(terms.borrowing_limit_by_model || {})) {
      addModelRow(model, limits || {});
    }
    $('c-borrow_by_default').checked = terms.borrow_by_default;
    $('c-borrowing_limit-cgpus').focus();
  }

  // Takes a project out of its cohort; the last one out ends the cohort (a cohort needs a member).
  async function removeMember(cohort, project, button) {
    button.disabled = true;
    try {
      const { members, ifMatch: unchanged } = await readCohort(cohort);
      delete members[project];
      const last = Object.keys(members).length === 0;
      const question = last
        ? `Take ${project} out of cohort ${cohort}? It is the last member: the cohort ends. What it borrowed stays held.`
        : `Take ${project} out of cohort ${cohort}? It keeps its quota; what it borrowed stays held.`;
      if (!window.confirm(question)) {
        button.disabled = false;
        return;
      }
      // Only as read and confirmed: a cohort changed meanwhile is shown again.
      if (last) await api('DELETE', cohortPath(cohort), undefined, unchanged);
      else await api('PUT', cohortPath(cohort), { members }, unchanged);
    } catch (e) {
      if (e.status === 401) {
        showSignIn(`Token refused: ${e.message}`);
        return;
      }
      if (changedMeanwhile(e)) {
        showBanner(`Cohort ${cohort} changed while you looked: nothing was done; it is shown as it is now.`);
        refresh();
        return;
      }
      showBanner(`Taking ${project} out of cohort ${cohort} failed: ${e.message}`);
      button.disabled = false;
      return;
    }
    refresh();
  }

  // Deletes the cohort as shown (`version`): one another admin changed since is shown again.
  async function deleteCohort(cohort, version, button) {
    if (!window.confirm(`Delete cohort ${cohort}? Its members keep their quotas; what they borrowed stays held.`)) return;
    button.disabled = true;
    try {
      await api('DELETE', cohortPath(cohort), undefined, ifMatch(version));
    } catch (e) {
      if (e.status === 401) {
        showSignIn(`Token refused: ${e.message}`);
        return;
      }
      if (changedMeanwhile(e)) {
        showBanner(`Cohort ${cohort} changed while you looked: it was not deleted; it is shown as it is now.`);
        refresh();
        return;
      }
      showBanner(`Delete cohort ${cohort} failed: ${e.message}`);
      button.disabled = false;
      return;
    }
    refresh();
  }

  const KIND_LABELS = { launch: 'launch', attach: 'attach', give_back: 'give back' };

  function asked(r) {
    return `${r.ncgpus} × ${r.mode}${r.gpu_memory_mib ? `, ${mem(r.gpu_memory_mib)} each` : ''}`;
  }

  function renderQueue() {
    const { lengths, requests } = state.queue;
    const total = lengths.reduce((a, l) => a + l.waiting, 0);
    $('queue-note').textContent = total === 0 ? 'Nothing waits for GPUs'
      : `${total} request${total === 1 ? '' : 's'} waiting in all${state.admin ? '' : '; yours are listed'}`;
    $('queue-lengths').replaceChildren(...lengths.map((l) => el('span', {
      class: 'badge queue-length', data: { priority: String(l.priority) },
      text: `priority ${l.priority}: ${l.waiting} waiting`,
    })));
    if (requests.length === 0) {
      $('queue-requests').replaceChildren(total === 0 ? el('div', { class: 'empty', text: 'Launches and attaches with "wait in the queue" show here while the GPUs are short.' })
        : el('div', { class: 'empty', text: 'None of them is yours.' }));
      return;
    }
    const head = ['#', 'VM', 'Waits for', 'cGPUs', 'Priority', 'Since'];
    if (state.admin) head.push('Project');
    const rows = requests.map((r) => el('tr', { class: 'queued-request', data: { vm: r.vm, kind: r.kind } },
      el('td', { class: 'position', text: String(r.position) }),
      el('td', {}, el('span', { class: 'swatch', style: { background: colorOf(r.vm) } }), ` ${r.vm_name}`),
      el('td', { text: KIND_LABELS[r.kind] || r.kind }),
      el('td', { text: asked(r) }),
      el('td', { text: String(r.priority) }),
      el('td', { text: clock(r.enqueued_ms) }),
      state.admin ? el('td', { text: r.project }) : null));
    $('queue-requests').replaceChildren(el('table', { class: 'queue-table' },
      el('thead', {}, el('tr', {}, head.map((h) => el('th', { text: h })))),
      el('tbody', {}, rows)));
  }

  // Memory each VM holds on each GPU, from the admin's VM list (cGPUs carry their GPU).
  function memoryByGpu() {
    const byGpu = new Map();
    for (const vm of state.vms) {
      for (const c of vm.cgpus) {
        if (!c.gpu) continue;
        const perVm = byGpu.get(c.gpu) || new Map();
        perVm.set(vm.id, (perVm.get(vm.id) || 0) + c.memory_mib);
        byGpu.set(c.gpu, perVm);
      }
    }
    return byGpu;
  }

  function renderHost(host) {
    const byGpu = memoryByGpu();
    const names = new Map(state.vms.map((vm) => [vm.id, vm]));
    const drain = host.state === 'drained'
      ? el('button', { type: 'button', class: 'small undrain', text: 'Undrain', on: { click: (e) => setDrained(host.name, false, e.target) } })
      : el('button', { type: 'button', class: 'small drain', text: 'Drain', on: { click: (e) => setDrained(host.name, true, e.target) } });
    const gpuHost = host.gpus.length > 0;
    const meta = gpuHost
      ? `${host.gpus.length} GPUs · ${host.vms} VM${host.vms === 1 ? '' : 's'} here`
      : `no GPUs · runs VMs that reach GPUs through rCUDA · ${host.vms} VM${host.vms === 1 ? '' : 's'} here`;
    return el('div', { class: `host ${host.state}${gpuHost ? ' gpu-host' : ''}`, data: { host: host.name, state: host.state } },
      el('div', { class: 'host-head' },
        el('span', { class: 'host-name', text: host.name }),
        el('span', { class: 'badge kind', text: KINDS[host.kind] || host.kind, title: host.kind }),
        el('span', { class: `badge state ${host.state}`, text: host.state }),
        el('span', { class: 'spacer' }),
        drain),
      el('div', { class: 'host-meta', text: meta }),
      gpuHost ? el('div', { class: 'gpus' }, host.gpus.map((g) => renderGpu(g, byGpu.get(g.id), names))) : null);
  }

  function renderGpu(gpu, perVm, vmsById) {
    const held = Object.entries(gpu.vms); // [vm id, cGPUs here]
    const known = perVm || new Map();
    const unknownIds = held.filter(([id]) => !known.has(id));
    const knownMib = Array.from(known.values()).reduce((a, b) => a + b, 0);
    const rest = unknownIds.length ? Math.max(0, gpu.allocated_mib - knownMib) / unknownIds.length : 0;
    const segments = held.map(([id, count]) => {
      const vm = vmsById.get(id);
      const mib = known.has(id) ? known.get(id) : rest;
      const name = vm ? vm.name : id.slice(0, 8);
      const label = count > 1 ? `${name} ×${count}` : name;
      const title = `${name} (${id})${vm ? ` · project ${vm.project}` : ''} · ${count} cGPU${count > 1 ? 's' : ''} · ${mem(mib)}`;
      return el('div', {
        class: 'segment', title, text: label, data: { vm: id },
        style: { width: `${Math.min(100, (mib / gpu.memory_mib) * 100)}%`, background: colorOf(id) },
      });
    });
    const use = gpu.exclusive ? 'exclusive' : gpu.cgpus === 0 ? 'idle' : `${gpu.cgpus} cGPU${gpu.cgpus === 1 ? '' : 's'}`;
    return el('div', { class: 'gpu', data: { gpu: gpu.id } },
      el('div', { class: 'gpu-label' },
        el('span', { class: 'gpu-model', title: gpu.id },
          el('span', { class: 'gpu-id', text: `GPU ${gpu.index}` }),
          ` ${gpu.model}${gpu.compute_capability ? ` (${gpu.compute_capability})` : ''}`),
        el('span', { class: 'gpu-use', text: `${mem(gpu.allocated_mib)} / ${gib(gpu.memory_mib)} · ${use}` })),
      el('div', { class: `gpu-bar${gpu.exclusive ? ' exclusive' : ''}`, role: 'img',
        'aria-label': `GPU ${gpu.index}: ${mem(gpu.allocated_mib)} of ${gib(gpu.memory_mib)} booked` }, segments),
      el('div', { class: 'gpu-rcuda', data: { remoting: gpu.remoting || 'rcuda' } },
        `${gpu.id} · ${layerName(gpu.remoting)} `, el('span', { class: 'mono', text: gpu.gpu_server || gpu.rcuda_endpoint })),
      renderGpuCondition(gpu));
  }

  // Why a GPU takes no new cGPUs (unhealthy, tainted, partitioned), what fences hold on it, and
  // which GPU a partition is carved from; none when fine.
  function renderGpuCondition(gpu) {
    const badges = [];
    if (gpu.partitions) badges.push(el('span', { class: 'badge partitioned',
      title: 'a partitioned GPU takes cGPUs through its partitions only, never whole',
      text: `${gpu.partitions} partition${gpu.partitions === 1 ? '' : 's'}` }));
    if (gpu.partition) badges.push(el('span', { class: 'badge partition',
      title: `a partition (MIG instance) of ${gpu.partition.parent}: its taint, health and evacuation cover it`,
      text: `${gpu.partition.profile} of ${gpu.partition.parent}` }));
    if (gpu.health) badges.push(el('span', { class: 'badge unhealthy', title: gpu.health, text: `unhealthy: ${gpu.health}` }));
    if (gpu.taint) badges.push(el('span', { class: 'badge tainted', title: gpu.taint, text: `tainted: ${gpu.taint}` }));
    if (gpu.fenced) badges.push(el('span', { class: 'badge fenced',
      title: 'bookings kept while a host that could not be reached may still route to them',
      text: `${gpu.fenced} fenced` }));
    return badges.length ? el('div', { class: 'gpu-condition' }, ...badges) : null;
  }

  function renderVms() {
    const shown = [...state.vms];
    const listed = new Set(shown.map((vm) => vm.id));
    for (const [id, entry] of state.terminated) if (!listed.has(id)) shown.push(entry.vm);
    const n = state.vms.length;
    $('vms-note').textContent = `${n} VM${n === 1 ? '' : 's'}${state.admin ? ' in all projects' : ''}`;
    const container = $('vms');
    if (shown.length === 0) {
      container.replaceChildren(el('div', { class: 'empty', text: 'No VMs yet. Launch one with the form.' }));
      return;
    }
    container.replaceChildren(...shown.map(renderVm));
  }

  function renderVm(vm) {
    const gone = vm.state === 'deleting' || vm.state === 'deleted';
    // One change at a time: while a cGPU comes or goes, the VM takes no other.
    const changing = vm.cgpus.some((c) => c.state !== 'live');
    const changeable = vm.state === 'ready' && !changing;
    const g = vm.gpus;
    const t = g.traits || {};
    const choice = [
      g.gpu_model && g.gpu_model.length ? g.gpu_model.join(' or ') : '',
      g.min_compute_capability ? `compute capability ≥ ${g.min_compute_capability}` : '',
      g.min_cuda_version ? `CUDA ≥ ${g.min_cuda_version}` : '',
      ...['required', 'forbidden', 'preferred', 'avoid'].map((k) => (t[k] && t[k].length ? `${k} ${t[k].join(', ')}` : '')),
      g.network && g.network.same ? `same ${g.network.same}${g.network.strength === 'preferred' ? ' (preferred)' : ''}` : '',
      g.network && g.network.max_rtt_us ? `round trip ≤ ${g.network.max_rtt_us} µs` : '',
      g.network && g.network.nearest ? 'nearest GPUs' : '',
    ].filter(Boolean);
    const request = `${g.ncgpus} × ${g.mode}${g.gpu_memory_mib ? `, ${mem(g.gpu_memory_mib)} each` : ''}`
      + `, ${g.locality}${g.distinct_gpus ? ', distinct GPUs' : ''}${choice.length ? `, ${choice.join('; ')}` : ''}`;
    const live = vm.cgpus.filter((c) => c.state === 'live').length;
    const facts = [
      ['Image', `${vm.image} · ${vm.flavor}`],
      ['cGPUs', `${live} live · launched with ${request}`],
      ['Policy', g.policy],
      ['Fixed IP', vm.fixed_ip || '…'],
    ];
    facts.push(['Scheduling', `priority ${vm.priority}${vm.preemptible
      ? ` · preemptible, ${vm.give_back ? 'gets taken cGPUs back' : 'does not get taken cGPUs back'}` : ''}`]);
    if (state.admin) facts.push(['Host', vm.host || '…']);
    facts.push(['Created', new Date(vm.created_ms).toLocaleString()]);
    // The layer's environment numbers the live cGPUs from 0 in attach order (the list's order);
    // a cGPU's own index, and with it its masked endpoint, stays for its whole life. A lost one
    // has no device: those after it are numbered one lower (GSAAS_CGPUS says which is which).
    const remoting = g.remoting || 'rcuda';
    facts.splice(1, 0, ['Remote GPUs', layerName(remoting)]);
    const env = vm.gpu_env || {};
    if (env.GSAAS_CGPUS_MISSING) {
      facts.push(['Missing', `cGPU ${env.GSAAS_CGPUS_MISSING.split(',').join(', ')}: no GPU now, so the devices after it are numbered lower`]);
    }
    let device = 0;
    const deviceName = (j) => (remoting === 'lupine' ? `LUPINE device ${j}` : `RCUDA_DEVICE_${j}`);
    const cgpus = vm.cgpus.map((c) => el('li', { class: `cgpu ${c.state}`, data: { index: String(c.index), state: c.state } },
      el('code', { class: 'device', text: c.state === 'live' ? deviceName(device++) : `cGPU ${c.index}` }), '→',
      el('code', { class: 'masked', text: c.masked_endpoint }),
      c.state === 'live' ? null : el('span', { class: 'cgpu-state', text: `${c.state}…` }),
      el('span', { class: 'muted', text: `#${c.index} · ${mem(c.memory_mib)} ${c.mode}` }),
      c.borrowed ? el('span', { class: 'badge borrowed', text: 'borrowed',
        title: 'Past your project\'s quota, on what its cohort lends: it may be taken back when a lender needs it' }) : null,
      c.gpu ? el('span', { class: 'where' }, 'on ', el('code', { text: c.gpu }), ' via ',
        el('code', { text: c.gpu_server || c.rcuda_endpoint })) : null,
      vm.state === 'ready' && c.state === 'live' ? el('button', {
        type: 'button', class: 'small danger detach', text: 'Detach', disabled: changing,
        title: `Detach cGPU #${c.index}: its route is withdrawn, then its GPU memory released`,
        on: { click: (e) => detachCgpu(vm, c, e.target) },
      }) : null));
    const attach = vm.state === 'ready' ? el('button', {
      type: 'button', class: 'small attach', text: 'Attach cGPUs', disabled: !changeable,
      on: { click: () => openAttach(vm) },
    }) : null;
    const terminate = gone ? null : el('button', {
      type: 'button', class: 'small danger terminate', text: 'Terminate',
      on: { click: (e) => terminateVm(vm, e.target) },
    });
    return el('article', { class: `vm ${vm.state}`, data: { vmId: vm.id, vmName: vm.name, state: vm.state } },
      el('div', { class: 'vm-head' },
        el('span', { class: 'swatch', style: { background: colorOf(vm.id) } }),
        el('span', { class: 'vm-name', text: vm.name }),
        el('code', { class: 'vm-id', text: vm.id.slice(0, 8), title: vm.id }),
        el('span', { class: `state ${vm.state}`, text: vm.state }),
        state.admin ? el('span', { class: 'badge', text: `project ${vm.project}` }) : null,
        el('span', { class: 'spacer' }),
        attach,
        terminate),
      vm.error ? el('div', { class: 'vm-error', text: vm.error }) : null,
      vm.state === 'queued' ? el('div', { class: 'queue-note', text: `Waiting for GPUs in the queue: position ${vm.queue_position ?? '…'}` }) : null,
      (vm.queued_attaches || []).length ? el('ul', { class: 'waiting' }, vm.queued_attaches.map((w) => el('li', {
        class: 'waiting-item', data: { kind: w.kind },
        text: `Waiting to ${w.kind === 'give_back' ? 'get back' : 'attach'} ${asked(w)} · position ${w.position} · since ${clock(w.enqueued_ms)}`,
      }))) : null,
      el('div', { class: 'vm-info' },
        el('dl', { class: 'facts' }, facts.map(([k, v]) => [el('dt', { text: k }), el('dd', { text: v })])),
        cgpus.length ? el('ul', { class: 'cgpus' }, cgpus) : null),
      renderEvents(vm),
      renderTimings(vm));
  }

  function renderEvents(vm) {
    const events = vm.events || [];
    if (events.length === 0) return null;
    return el('div', { class: 'events' },
      el('h3', { text: 'Events' }),
      el('ul', {}, events.map((e) => el('li', { class: 'event', data: { kind: e.kind } },
        el('span', { class: 'event-at', text: clock(e.at_ms) }),
        el('span', { class: `badge event-kind ${e.kind}`, text: e.kind.replace('_', ' ') }),
        el('span', { class: 'event-detail', text: e.detail })))));
  }

  function renderTimings(vm) {
    const t = vm.timings || {};
    const known = STAGES.map(([k]) => t[k]).filter((v) => typeof v === 'number');
    const total = typeof t.total === 'number' ? t.total : known.reduce((a, b) => a + b, 0);
    const scale = Math.max(total, ...known, 1e-9);
    const row = (key, label, value, extra) => el('div', { class: `stage${extra || ''}${typeof value === 'number' ? '' : ' pending'}`, data: { stage: key } },
      el('span', { text: label }),
      el('div', { class: 'track' }, typeof value === 'number'
        ? el('div', { class: `fill s-${key}`, style: { width: `${Math.max(0, Math.min(100, (value / scale) * 100))}%` } })
        : null),
      el('span', { class: 'secs', text: secs(value) }));
    return el('div', { class: 'timings' },
      el('h3', { text: 'Stage timings (Equation 5.1)' }),
      STAGES.map(([key, label]) => row(key, label, t[key])),
      row('total', 'Total', typeof t.total === 'number' ? t.total : undefined, ' total'));
  }

  // ---- Actions ---------------------------------------------------------------------------------

  async function terminateVm(vm, button) {
    if (!window.confirm(`Terminate ${vm.name} (${vm.id.slice(0, 8)})? Its cGPUs are released.`)) return;
    button.disabled = true;
    try {
      const after = await api('DELETE', `/v1/vms/${encodeURIComponent(vm.id)}`);
      state.terminated.set(vm.id, { vm: after, since: Date.now() });
    } catch (e) {
      showBanner(`Terminate ${vm.name} failed: ${e.message}`);
      button.disabled = false;
      return;
    }
    refresh();
  }

  async function detachCgpu(vm, cgpu, button) {
    const what = `cGPU #${cgpu.index} (${cgpu.masked_endpoint}) from ${vm.name}`;
    if (!window.confirm(`Detach ${what}? Open connections to it are cut.`)) return;
    button.disabled = true;
    try {
      await api('DELETE', `/v1/vms/${encodeURIComponent(vm.id)}/cgpus/${cgpu.index}`);
    } catch (e) {
      if (e.status === 401) {
        showSignIn(`Token refused: ${e.message}`);
        return;
      }
      showBanner(`Detach ${what} failed: ${e.message}`);
      button.disabled = false;
      return;
    }
    refresh();
  }

  async function setDrained(host, drained, button) {
    button.disabled = true;
    try {
      await api('POST', `/v1/hosts/${encodeURIComponent(host)}/${drained ? 'drain' : 'undrain'}`);
    } catch (e) {
      showBanner(`${drained ? 'Drain' : 'Undrain'} ${host} failed: ${e.message}`);
      button.disabled = false;
      return;
    }
    refresh();
  }

  function showBanner(text) {
    const banner = $('banner');
    banner.textContent = text;
    banner.hidden = false;
  }

  // ---- Launch form -----------------------------------------------------------------------------

  function clearFormErrors(form, error) {
    for (const node of document.querySelectorAll(`#${form} [data-error-for]`)) node.textContent = '';
    for (const node of document.querySelectorAll(`#${form} [aria-invalid]`)) node.removeAttribute('aria-invalid');
    $(error).textContent = '';
  }

  // A remote-GPU layer as people write it.
  function layerName(remoting) {
    return remoting === 'lupine' ? 'LUPINE' : 'rCUDA';
  }

  function launchBody() {
    const value = (name) => $(`f-${name}`).value.trim();
    const body = {
      image: value('image'),
      flavor: value('flavor'),
      networks: value('networks').split(',').map((s) => s.trim()).filter(Boolean),
      // Numbers go as typed: the service checks them and names the field when they are wrong.
      ncgpus: value('ncgpus') === '' ? null : Number(value('ncgpus')),
      mode: $('f-mode').value,
      locality: $('f-locality').value,
      distinct_gpus: $('f-distinct_gpus').checked,
      queue: $('f-queue').checked,
      priority: value('priority') === '' ? 0 : Number(value('priority')),
      preemptible: $('f-preemptible').checked,
      give_back: $('f-give_back').checked,
    };
    // Unsaid: the project's default in its cohort.
    if ($('f-borrow').value) body.borrow = $('f-borrow').value === 'true';
    if (value('name')) body.name = value('name');
    if ($('f-user_data').value.trim()) body.user_data = $('f-user_data').value;
    if (value('gpu_memory_mib') !== '') body.gpu_memory_mib = Number(value('gpu_memory_mib'));
    if (value('policy')) body.policy = value('policy');
    if ($('f-remoting').value) body.remoting = $('f-remoting').value;
    const list = (name) => value(name).split(',').map((s) => s.trim()).filter(Boolean);
    if (list('gpu_model').length) body.gpu_model = list('gpu_model');
    for (const name of ['min_compute_capability', 'min_cuda_version']) {
      if (value(name)) body[name] = value(name);
    }
    const traits = {};
    for (const strength of ['required', 'forbidden', 'preferred', 'avoid']) {
      if (list(`traits_${strength}`).length) traits[strength] = list(`traits_${strength}`);
    }
    if (Object.keys(traits).length) body.traits = traits;
    const network = {};
    if (value('network_same')) {
      network.same = value('network_same');
      network.strength = $('f-network_strength').value;
    }
    if (value('network_max_rtt_us') !== '') network.max_rtt_us = Number(value('network_max_rtt_us'));
    if ($('f-network_nearest').checked) network.nearest = true;
    if (Object.keys(network).length) body.network = network;
    return body;
  }

  // The problem's field (`ncgpus`, `networks[1]`, `body` with "missing field `image`") to a field of `form`.
  function formField(problem, form) {
    let field = problem.field || '';
    const missing = /missing field `([a-z_]+)`/.exec(problem.detail || '');
    if (field === 'body' && missing) field = missing[1];
    // `traits.required` has an input of its own.
    if (field.startsWith('traits.') || field.startsWith('network.')) field = field.replace('.', '_');
    field = field.split(/[[.]/)[0];
    return document.querySelector(`#${form} [data-error-for="${CSS.escape(field)}"]`) ? field : null;
  }

  // What a refusal of a launch or an attach means, by status.
  const LAUNCH_REFUSALS = { 403: 'Over quota', 429: 'Too many requests waiting', 507: 'Not enough GPU capacity', 503: 'The cloud is unavailable' };

  // Shows a refused request's problem beside each field at fault in `form` (inputs
  // `${prefix}-<field>`; the problem's `errors` lists them all; `fieldOf` names an entry's field
  // of the form, or null), and in `error` what names no field of the form, after what `labels`
  // says the status means.
  function showProblem(e, form, prefix, error, { fieldOf = (entry) => formField(entry, form), labels = LAUNCH_REFUSALS } = {}) {
    const entries = (e.problem && e.problem.errors) || [];
    const elsewhere = [];
    let first = null;
    for (const entry of entries) {
      const field = fieldOf(entry);
      if (!field) {
        elsewhere.push(`${entry.field}: ${entry.detail}`);
        continue;
      }
      document.querySelector(`#${form} [data-error-for="${field}"]`).textContent = entry.detail;
      const input = $(`${prefix}-${field}`);
      input.setAttribute('aria-invalid', 'true');
      first = first || input;
    }
    if (first) first.focus();
    if (first && elsewhere.length === 0) return;
    const what = labels[e.status];
    const message = elsewhere.length ? elsewhere.join('; ') : e.message;
    $(error).textContent = what ? `${what}: ${message}` : message;
  }

  async function launch(event) {
    event.preventDefault();
    clearFormErrors('launch-form', 'launch-error');
    $('launch-ok').textContent = '';
    const submit = $('launch-submit');
    submit.disabled = true;
    submit.textContent = 'Launching…';
    try {
      const vm = await api('POST', '/v1/vms', launchBody(), { 'Idempotency-Key': newKey() });
      $('launch-ok').textContent = vm.state === 'queued'
        ? `Queued: ${vm.name} (${vm.id.slice(0, 8)}) waits for GPUs at position ${vm.queue_position}; it starts by itself.`
        : `Accepted: ${vm.name} (${vm.id.slice(0, 8)}) is ${vm.state}; follow it under Virtual machines.`;
      await refresh();
    } catch (e) {
      if (e.status === 401) {
        showSignIn(`Token refused: ${e.message}`);
        return;
      }
      showProblem(e, 'launch-form', 'f', 'launch-error');
    } finally {
      submit.disabled = false;
      submit.textContent = 'Launch';
    }
  }

  // ---- Attach dialog ---------------------------------------------------------------------------

  function openAttach(vm) {
    state.attachTo = vm;
    clearFormErrors('attach-form', 'attach-error');
    $('attach-vm').textContent = vm.name;
    $('a-ncgpus').value = '1';
    $('a-mode').value = vm.gpus.mode === 'exclusive' ? 'exclusive' : 'shared';
    $('a-gpu_memory_mib').value = vm.gpus.gpu_memory_mib ? String(vm.gpus.gpu_memory_mib) : '';
    $('a-policy').value = '';
    $('a-distinct_gpus').checked = false;
    $('a-queue').checked = false;
    $('a-borrow').value = '';
    $('attach-dialog').showModal();
    $('a-ncgpus').focus();
  }

  function attachBody() {
    const value = (name) => $(`a-${name}`).value.trim();
    const body = {
      ncgpus: value('ncgpus') === '' ? null : Number(value('ncgpus')),
      mode: $('a-mode').value,
      distinct_gpus: $('a-distinct_gpus').checked,
      queue: $('a-queue').checked,
    };
    if ($('a-borrow').value) body.borrow = $('a-borrow').value === 'true';
    if (value('gpu_memory_mib') !== '') body.gpu_memory_mib = Number(value('gpu_memory_mib'));
    if (value('policy')) body.policy = value('policy');
    return body;
  }

  async function attach(event) {
    event.preventDefault();
    const vm = state.attachTo;
    if (!vm) return;
    clearFormErrors('attach-form', 'attach-error');
    const submit = $('attach-submit');
    submit.disabled = true;
    submit.textContent = 'Attaching…';
    try {
      await api('POST', `/v1/vms/${encodeURIComponent(vm.id)}/cgpus`, attachBody(), { 'Idempotency-Key': newKey() });
      $('attach-dialog').close();
      await refresh();
    } catch (e) {
      if (e.status === 401) {
        $('attach-dialog').close();
        showSignIn(`Token refused: ${e.message}`);
        return;
      }
      showProblem(e, 'attach-form', 'a', 'attach-error');
    } finally {
      submit.disabled = false;
      submit.textContent = 'Attach';
    }
  }

  // ---- Start -----------------------------------------------------------------------------------

  function start() {
    $('signin-form').addEventListener('submit', (event) => {
      event.preventDefault();
      const token = $('token').value.trim();
      if (!token) {
        $('signin-error').textContent = 'Paste a token first.';
        return;
      }
      $('signin-error').textContent = '';
      signIn(token);
    });
    $('sign-out').addEventListener('click', signOut);
    $('keystone-form').addEventListener('submit', (event) => {
      event.preventDefault();
      signInKeystone();
    });
    $('ks-use-appcred').addEventListener('click', () => {
      const appcred = !$('ks-password-fields').hidden;
      $('ks-password-fields').hidden = appcred;
      $('ks-appcred-fields').hidden = !appcred;
      $('ks-use-appcred').textContent = appcred ? 'Use a user name and password' : 'Use an application credential';
      $('keystone-error').textContent = '';
    });
    $('ks-use-token').addEventListener('click', () => {
      state.useToken = true;
      showSignIn('');
    });
    $('ks-use-keystone').addEventListener('click', () => {
      state.useToken = false;
      showSignIn('');
    });
    $('project-select').addEventListener('change', () => switchProject($('project-select').value));
    $('usage-range').addEventListener('change', () => {
      state.usageRange = $('usage-range').value;
      refreshUsage(state.generation);
    });
    $('launch-form').addEventListener('submit', launch);
    $('attach-form').addEventListener('submit', attach);
    $('cohort-form').addEventListener('submit', saveMember);
    for (const node of document.querySelectorAll('#cohort-form [data-limits]')) {
      node.replaceChildren(...limitFields(node.dataset.limits));
    }
    $('c-add-model').addEventListener('click', () => $(`c-${addModelRow()}`).focus());
    $('attach-cancel').addEventListener('click', () => $('attach-dialog').close());
    $('attach-dialog').addEventListener('close', () => { state.attachTo = null; });
    $('f-mode').addEventListener('change', () => {
      $('f-gpu_memory_mib').placeholder = $('f-mode').value === 'shared' ? '2048' : 'optional';
    });
    $('f-gpu_memory_mib').placeholder = $('f-mode').value === 'shared' ? '2048' : 'optional';
    // Giving back is a preemptible VM's choice only.
    $('f-preemptible').addEventListener('change', () => {
      $('f-give_back').disabled = !$('f-preemptible').checked;
    });
    document.addEventListener('visibilitychange', () => {
      if (!document.hidden && state.token && !$('main-view').hidden) refresh();
    });
    const saved = sessionStorage.getItem(TOKEN_KEY);
    fetch('/v1/auth', { headers: { Accept: 'application/json' }, credentials: 'omit', cache: 'no-store' })
      .then((r) => (r.ok ? r.json() : { mode: 'jwt' }))
      .catch(() => ({ mode: 'jwt' }))
      .then((methods) => {
        state.authMode = methods.mode === 'keystone' ? 'keystone' : 'jwt';
        if (methods.default_domain) $('ks-domain').value = methods.default_domain;
        if (saved) signIn(saved);
        else showSignIn('');
      });
  }

  start();
})();
