/*
 * terminal_e2e.js - a headless Chromium for test_terminal.py, driven over
 * stdin/stdout: one JSON request per line in, one JSON answer per line out
 * ({"ok":true,"value":...} or {"ok":false,"error":"..."}). The test keeps
 * all the logic and the assertions; this only drives the browser.
 *
 *   node terminal_e2e.js            (NODE_PATH: node_modules with playwright-core,
 *                                    CHROMIUM: the browser, default /usr/bin/chromium)
 *
 * Requests:
 *   {"cmd":"open","url":U,"headers":{...},"width":W,"height":H}  a new page at U
 *   {"cmd":"info"}      {state, pid, offset, drawing, held, cols, rows, url} of the terminal
 *   {"cmd":"text"}      the terminal's whole buffer as text
 *   {"cmd":"type","text":T}   keystrokes (\n is Enter)
 *   {"cmd":"press","key":K}   one key, e.g. "Control+C"
 *   {"cmd":"resize","width":W,"height":H}
 *   {"cmd":"reload"}
 *   {"cmd":"ping"}      a round trip through the page's JS thread
 *   {"cmd":"errors"}    uncaught page errors seen so far
 *   {"cmd":"console"}   console errors seen so far
 *   {"cmd":"close"}
 */
'use strict';

const readline = require('readline');
const { chromium } = require('playwright-core');

let browser = null, context = null, page = null;
const errors = [];  /* uncaught exceptions in the page: a test wants none */
const console_ = []; /* console errors (failed reconnects among them): for diagnosis */

async function ready() {
  await page.waitForFunction(() => window.warrenTerminal !== undefined, null, { timeout: 60000 });
  await page.click('#term');
}

async function open(r) {
  if (!browser) {
    browser = await chromium.launch({
      executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
      headless: true,
      // No calls home: this machine's network is closed, and each refused one is noise.
      args: ['--disable-gpu', '--disable-quic', '--disable-background-networking',
             '--disable-component-update', '--disable-sync', '--no-first-run'],
    });
  }
  if (context)
    await context.close();
  context = await browser.newContext({
    viewport: { width: r.width || 1000, height: r.height || 600 },
    extraHTTPHeaders: r.headers || {},
  });
  page = await context.newPage();
  page.on('pageerror', (e) => errors.push(String(e)));
  page.on('console', (m) => { if (m.type() === 'error') console_.push(m.text()); });
  await page.goto(r.url);
  await ready();
  return null;
}

const handlers = {
  open,
  info: () => page.evaluate(() => {
    const t = window.warrenTerminal;
    return { state: t.state, pid: t.pid, offset: t.offset, drawing: t.drawing, held: t.held,
             cols: t.term.cols, rows: t.term.rows, url: location.href };
  }),
  text: () => page.evaluate(() => window.warrenTerminal.text()),
  type: async (r) => {
    const parts = r.text.split('\n');
    for (let i = 0; i < parts.length; i++) {
      if (parts[i])
        await page.keyboard.type(parts[i]);
      if (i < parts.length - 1)
        await page.keyboard.press('Enter');
    }
    return null;
  },
  press: async (r) => { await page.keyboard.press(r.key); return null; },
  resize: async (r) => { await page.setViewportSize({ width: r.width, height: r.height }); return null; },
  reload: async () => { await page.reload(); await ready(); return null; },
  ping: () => page.evaluate(() => Date.now()),
  errors: async () => errors.slice(),
  console: async () => console_.slice(),
  close: async () => {
    if (browser)
      await browser.close();
    browser = null;
    return null;
  },
};

async function main() {
  const rl = readline.createInterface({ input: process.stdin });
  for await (const line of rl) {
    if (!line.trim())
      continue;
    let r, out;
    try {
      r = JSON.parse(line);
      const h = handlers[r.cmd];
      if (!h)
        throw new Error('unknown cmd ' + r.cmd);
      out = { ok: true, value: await h(r) };
    } catch (e) {
      out = { ok: false, error: String(e && e.stack || e) };
    }
    process.stdout.write(JSON.stringify(out) + '\n');
    if (r && r.cmd === 'close')
      break;
  }
  if (browser)
    await browser.close();
}

main().catch((e) => {
  process.stderr.write(String(e && e.stack || e) + '\n');
  process.exit(1);
});
