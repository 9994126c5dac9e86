// E2B's unmodified JS SDK (npm e2b@2.51.0) against warrend's envd door: the
// data-plane calls (commands, pty, files) on a sandbox made through the
// control plane, a request to a port of it at the host getHost names, and
// commands.connect after a kill -9 of warrend. Run by test_envd.py with
// E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY pointing at warrend and
// E2B_TEST_PORT_DOMAIN its port_domain. Prints one JSON line per check
// ({"check": name, "ok": bool, ...}) and exits non-zero on the first failure.
// Once it prints {"need": "restart", "id": ...}: the test kills warrend with SIGKILL,
// starts it again, and writes "go" to this script's stdin.
import http from 'node:http'
import readline from 'node:readline'
import { Sandbox, CommandExitError } from 'e2b'

const TEMPLATE = process.env.E2B_TEST_TEMPLATE || 'base'
const dec = new TextDecoder()
const enc = new TextEncoder()

function check(name, ok, extra = {}) {
  console.log(JSON.stringify({ check: name, ok: !!ok, ...extra }))
  if (!ok) process.exit(1)
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// The test's answers on stdin, one line each.
const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]()

// There is no DNS for getHost's name here: the request goes to warrend's own
// address, with the Host header exactly what getHost gave.
function get(host, path, headers) {
  const url = new URL(process.env.E2B_SANDBOX_URL)
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: url.hostname, port: url.port, path, headers: { Host: host, ...headers },
    }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (d) => { body += d })
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

// Until cond() holds (a minute at most): whether it did.
async function until(cond) {
  for (let i = 0; i < 600; i++) {
    if (cond()) return true
    await sleep(100)
  }
  return false
}

// Until the output gathered in buf() holds counter line c<n> with n above after.
async function counterPast(buf, after) {
  for (let i = 0; i < 600; i++) {
    const ns = [...buf().matchAll(/c(\d+)\n/g)].map((m) => +m[1])
    if (ns.some((n) => n > after)) return Math.max(...ns)
    await sleep(100)
  }
  return -1
}

async function main() {
  const sbx = await Sandbox.create(TEMPLATE, { timeoutMs: 3600 * 1000 })
  check('create', !!sbx.sandboxId, { id: sbx.sandboxId })

  // commands.run in the foreground: output, exit code, envs, cwd
  const r = await sbx.commands.run('echo hello; echo oops 1>&2')
  check('commands.run', r.exitCode === 0 && r.stdout === 'hello\n' && r.stderr === 'oops\n', { r })
  const streamed = []
  const r2 = await sbx.commands.run('echo $FOO; pwd', {
    envs: { FOO: 'bar' }, cwd: '/tmp', onStdout: (d) => streamed.push(d),
  })
  check('envs and cwd', r2.stdout === 'bar\n/tmp\n' && streamed.join('') === 'bar\n/tmp\n', { r2, streamed })
  try {
    await sbx.commands.run('exit 3')
    check('exit code error', false)
  } catch (e) {
    check('exit code error', e instanceof CommandExitError && e.exitCode === 3, { e: String(e) })
  }

  // background: listed, killed
  const bg = await sbx.commands.run('sleep 1000', { background: true })
  const listed = await sbx.commands.list()
  check('commands.list', listed.some((p) => p.pid === bg.pid), { listed })
  check('commands.kill', (await sbx.commands.kill(bg.pid)) === true)
  // the signal is sent when kill answers; the exit is seen a moment later
  let after = []
  for (let i = 0; i < 300; i++) {
    after = await sbx.commands.list()
    if (!after.some((p) => p.pid === bg.pid)) break
    await new Promise((r) => setTimeout(r, 100))
  }
  check('killed not listed', !after.some((p) => p.pid === bg.pid), { after })

  // stdin
  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'through stdin\n')
  await sbx.commands.closeStdin(cat.pid)
  const catr = await cat.wait()
  check('sendStdin and closeStdin', catr.stdout === 'through stdin\n' && catr.exitCode === 0, { catr })

  // a dropped stream, then connect by pid: the command ran on
  const counter = await sbx.commands.run('for i in $(seq 1 15); do echo n$i; sleep 0.2; done', { background: true })
  await counter.disconnect()
  const again = await sbx.commands.connect(counter.pid)
  const againr = await again.wait()
  check('connect after disconnect', againr.exitCode === 0 && againr.stdout.includes('n15\n'), { againr })

  // pty: create, resize, input, exit
  let out = ''
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d) } })
  await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
  await sbx.pty.sendInput(term.pid, enc.encode('stty size; echo pty=$((6*7)); exit\n'))
  const termr = await term.wait()
  check('pty', out.includes('30 100') && out.includes('pty=42') && termr.exitCode === 0, { out: out.slice(-400) })

  // files
  const w = await sbx.files.write('/tmp/e2b/a.txt', 'hello file')
  check('files.write', w.path === '/tmp/e2b/a.txt' && w.name === 'a.txt', { w })
  check('files.read', (await sbx.files.read('/tmp/e2b/a.txt')) === 'hello file')
  const bytes = new Uint8Array(200000).map((_, i) => (i * 7) & 255)
  await sbx.files.write('/tmp/e2b/b.bin', bytes)
  const back = await sbx.files.read('/tmp/e2b/b.bin', { format: 'bytes' })
  check('files binary', back.length === bytes.length && back.every((v, i) => v === bytes[i]))
  const list = await sbx.files.list('/tmp/e2b')
  check('files.list', list.map((e) => e.name).sort().join() === 'a.txt,b.bin' &&
    list.find((e) => e.name === 'a.txt').type === 'file', { list })
  // watchDir: a stream of the directory's events until stopped
  const events = []
  const watcher = await sbx.files.watchDir('/tmp/e2b', (ev) => events.push(ev), { recursive: true })
  await sbx.files.write('/tmp/e2b/w.txt', 'watched')
  for (let i = 0; i < 300 && !events.some((ev) => ev.name === 'w.txt' && ev.type === 'create'); i++) {
    await new Promise((r) => setTimeout(r, 100))
  }
  await watcher.stop()
  check('files.watchDir', events.some((ev) => ev.name === 'w.txt' && ev.type === 'create'), { events })
  await sbx.files.remove('/tmp/e2b/w.txt')
  check('files.makeDir', (await sbx.files.makeDir('/tmp/e2b/d')) === true)
  check('files.makeDir exists', (await sbx.files.makeDir('/tmp/e2b/d')) === false)
  const mv = await sbx.files.rename('/tmp/e2b/a.txt', '/tmp/e2b/d/c.txt')
  check('files.rename', mv.path === '/tmp/e2b/d/c.txt', { mv })
  check('files.exists', (await sbx.files.exists('/tmp/e2b/d/c.txt')) === true &&
    (await sbx.files.exists('/tmp/e2b/a.txt')) === false)
  await sbx.files.remove('/tmp/e2b/d')
  check('files.remove', (await sbx.files.exists('/tmp/e2b/d')) === false)

  // a port of the sandbox through Warren's port proxy, at the host getHost names
  await sbx.files.write('/tmp/www/hello.txt', 'served from the sandbox\n')
  const srv = await sbx.commands.run('python3 -m http.server 8000', { background: true, cwd: '/tmp/www' })
  const host = sbx.getHost(8000)
  check('getHost', host === `8000-${sbx.sandboxId}.${process.env.E2B_TEST_PORT_DOMAIN}`, { host })
  // E2B's header for a sandbox whose traffic is not public; Warren's ports all need one
  check('trafficAccessToken', /^[0-9a-f]{64}$/.test(sbx.trafficAccessToken || ''))
  const auth = { 'E2B-Traffic-Access-Token': sbx.trafficAccessToken }
  let page = null
  for (let i = 0; i < 600; i++) { // until python3 listens
    page = await get(host, '/hello.txt', auth)
    if (page.status !== 502) break
    await sleep(100)
  }
  check('port request', page.status === 200 && page.body === 'served from the sandbox\n', { page })
  const none = await get(host, '/hello.txt', {})
  const wrong = await get(host, '/hello.txt', { 'E2B-Traffic-Access-Token': sbx.envdAccessToken })
  check('port request needs the token', none.status === 401 && wrong.status === 401, { none, wrong })
  check('port server killed', (await sbx.commands.kill(srv.pid)) === true)

  // a command through a kill -9 of warrend: its stream breaks; connect takes it up
  // again. A file written after each connect makes it print a line: output made
  // after the restart, not only what it had printed before.
  let before = ''
  const ticker = await sbx.commands.run('i=0; while :; do echo c$i; ' +
    'for m in 1 2; do [ -e /tmp/tick/go$m ] && echo after$m; done; i=$((i+1)); sleep 0.2; done', {
    background: true, onStdout: (d) => { before += d },
  })
  const last = await counterPast(() => before, 1)
  check('counter runs', last > 1, { before: before.slice(-200) })
  // the broken stream's end is not this script's failure
  const lost = ticker.wait().then(() => 'ended', (e) => String(e))
  console.log(JSON.stringify({ need: 'restart', id: sbx.sandboxId }))
  const go = await lines.next()
  check('restarted', !go.done && go.value.trim() === 'go', { go })
  const seen = Math.max(...[...before.matchAll(/c(\d+)\n/g)].map((m) => +m[1]))
  let again1 = ''
  const h1 = await sbx.commands.connect(ticker.pid, { onStdout: (d) => { again1 += d } })
  await sbx.files.write('/tmp/tick/go1', '')
  const past1 = await counterPast(() => again1, seen)
  const fresh1 = await until(() => again1.includes('after1\n'))
  check('connect after restart', h1.pid === ticker.pid && past1 > seen && fresh1,
    { seen, again: again1.slice(-200), lost: await Promise.race([lost, sleep(1000).then(() => 'pending')]) })
  check('listed after restart', (await sbx.commands.list()).some((p) => p.pid === ticker.pid))
  await h1.disconnect()
  const sbx2 = await Sandbox.connect(sbx.sandboxId)
  let again2 = ''
  const h2 = await sbx2.commands.connect(ticker.pid, { onStdout: (d) => { again2 += d } })
  await sbx2.files.write('/tmp/tick/go2', '')
  const fresh2 = await until(() => again2.includes('after2\n'))
  check('Sandbox.connect after restart', fresh2 && (await counterPast(() => again2, past1)) > past1,
    { past1, again: again2.slice(-200) })
  check('listed by the new Sandbox', (await sbx2.commands.list()).some((p) => p.pid === ticker.pid))
  check('counter killed', (await sbx2.commands.kill(ticker.pid)) === true)
  await h2.wait().catch(() => {})

  await sbx.kill()
  check('done', true)
}

main().then(() => process.exit(0), (e) => {
  console.log(JSON.stringify({ check: 'exception', ok: false, error: String(e), stack: e.stack }))
  process.exit(1)
})
