// E2B's unmodified JS SDK (npm e2b@2.51.0) against warrend's envd door: the
// data-plane calls (commands, pty, files) on a sandbox made through the
// control plane. Run by test_envd.py with E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY pointing at warrend. Prints one JSON line per check ({"check":
// name, "ok": bool, ...}) and exits non-zero on the first failure.
import { Sandbox, CommandExitError } from 'e2b'

const TEMPLATE = process.env.E2B_TEST_TEMPLATE || 'base'
const dec = new TextDecoder()
const enc = new TextEncoder()

function check(name, ok, extra = {}) {
  console.log(JSON.stringify({ check: name, ok: !!ok, ...extra }))
  if (!ok) process.exit(1)
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

  await sbx.kill()
  check('done', true)
}

main().catch((e) => {
  console.log(JSON.stringify({ check: 'exception', ok: false, error: String(e), stack: e.stack }))
  process.exit(1)
})
