// What the browser scripts share: Debian's headless chromium through playwright-core (no browser
// download), a bound on the whole run, checks, and the page's problems (page errors, console
// errors but the refusals a script provokes, requests that leave the allowed origin).
import { chromium } from 'playwright-core';
import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export function need(name) {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
}

export function check(condition, message) {
  if (!condition) throw new Error(`check failed: ${message}`);
}

// Exits non-zero if the script is still running after `overallMs`.
export function bound(tag, overallMs) {
  const overall = setTimeout(() => {
    console.error(`${tag}: FAILED: still running after ${overallMs / 1000} s`);
    process.exit(2);
  }, overallMs);
  overall.unref();
  return (message) => console.log(`${tag}: ${message}`);
}

// Opens a page. `origin`: the only origin it may fetch from (null: any); `refusals`: the HTTP
// statuses whose failed loads the page may log; `shots`: the screenshot directory (created).
export async function openPage({ origin = null, refusals = [], viewport, waitMs, shots }) {
  const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';
  if (!existsSync(executablePath)) throw new Error(`no browser at ${executablePath} (apt-get install -y chromium)`);
  mkdirSync(shots, { recursive: true });
  const problems = [];
  const profile = mkdtempSync(join(tmpdir(), 'gsaas-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport,
    timeout: 60000,
  });
  context.setDefaultTimeout(waitMs);
  if (origin) {
    await context.route('**/*', (route) => {
      const url = route.request().url();
      if (url.startsWith('data:') || new URL(url).origin === origin) return route.continue();
      problems.push(`request off origin: ${url}`);
      return route.abort();
    });
  }
  const page = context.pages()[0] || await context.newPage();
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  const refused = new RegExp(`Failed to load resource: the server responded with a status of (${refusals.join('|') || 'none'})`);
  page.on('console', (m) => {
    if (m.type() === 'error' && !refused.test(m.text())) problems.push(`console error: ${m.text()}`);
  });
  page.on('dialog', (d) => d.accept());
  const close = async () => {
    await context.close();
    rmSync(profile, { recursive: true, force: true });
  };
  return { context, page, problems, close };
}
