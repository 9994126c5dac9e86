// load/sdk_bench.mjs - E2B's unmodified JS SDK (npm e2b, @e2b/code-interpreter) against
// warrend's E2B doors, timed: run by load/sdk_bench.py with E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY pointing at warrend. Prints one JSON line of
// results; exits non-zero when an answer is wrong (a benchmark of wrong answers
// measures nothing).
import http from 'node:http'
import { Sandbox } from 'e2b'

const env = process.env
const N_CREATE = +(env.N_CREATE || 3)
const N_RUN = +(env.N_RUN || 50)
const MIB = +(env.MIB || 10)
const TEMPLATE = env.BENCH_TEMPLATE || 'base'
const CODE = env.CODE_TEMPLATE || ''
const N_CODE = +(env.N_CODE || 20)
const N_READ = +(env.N_READ || 5)
const now = () => performance.now()

function fail(what, extra) {
  console.log(JSON.stringify({ error: what, ...extra }))
  process.exit(1)
}

async function main() {
  const out = { create_first: [], run_true: [] }
  let sbx = null
  for (let i = 0; i < N_CREATE; i++) {
    const t0 = now()
    const s = await Sandbox.create(TEMPLATE, { timeoutMs: 3600 * 1000, requestTimeoutMs: 900 * 1000 })
    const r = await s.commands.run('echo ready')
    out.create_first.push(now() - t0)
    if (r.stdout !== 'ready\n') fail('echo ready', { r })
    if (sbx) await sbx.kill()
    sbx = s
  }
  for (let i = 0; i < N_RUN; i++) {
    const t0 = now()
    const r = await sbx.commands.run('true')
    out.run_true.push(now() - t0)
    if (r.exitCode !== 0) fail('true', { r })
  }
  // incompressible bytes: the gzip write's figure is zlib's worst case
  const data = new Uint8Array(MIB << 20)
  for (let off = 0; off < data.length; off += 65536)
    crypto.getRandomValues(data.subarray(off, Math.min(off + 65536, data.length)))
  const same = (b) => b.length === data.length && b.every((v, i) => v === data[i])
  for (const [key, opts] of [['write', {}], ['write_gzip', { gzip: true }]]) {
    let t0 = now()
    await sbx.files.write('/tmp/bench.bin', data, opts)
    out[key + '_s'] = (now() - t0) / 1e3
    t0 = now()
    const back = await sbx.files.read('/tmp/bench.bin', { format: 'bytes' })
    if (key === 'write') out.read_first_s = (now() - t0) / 1e3
    if (!same(back)) fail(key + ' read back', { len: back.length })
  }
  // Every way an SDK user reads a file, each N_READ times. 'text', the default, is
  // for text: an ASCII file of the same size.
  const text = Array.from({ length: data.length }, (_, i) => String.fromCharCode(97 + (data[i] % 26))).join('')
  await sbx.files.write('/tmp/bench.txt', text)
  const concat = (chunks) => {
    const b = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0))
    let o = 0
    for (const c of chunks) { b.set(c, o); o += c.length }
    return b
  }
  // The same GET /files without the SDK, through Node's own http client: what is
  // Node's and what is the SDK's.
  const url = new URL(env.E2B_SANDBOX_URL)
  const rawGet = () => new Promise((resolve, reject) => {
    http.get({
      host: url.hostname, port: url.port, path: '/files?path=' + encodeURIComponent('/tmp/bench.bin'),
      headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983', 'X-Access-Token': sbx.envdAccessToken },
    }, (res) => {
      const chunks = []
      res.on('data', (c) => chunks.push(c))
      res.on('end', () => resolve(res.statusCode === 200 ? concat(chunks) : null))
    }).on('error', reject)
  })
  // each way's read (timed) and the check of what it gave (not timed)
  const ways = {
    read_bytes: [() => sbx.files.read('/tmp/bench.bin', { format: 'bytes' }), same],
    read_blob: [async () => new Uint8Array(await (await sbx.files.read('/tmp/bench.bin', { format: 'blob' })).arrayBuffer()), same],
    read_stream: [async () => {
      const chunks = []
      for await (const c of await sbx.files.read('/tmp/bench.bin', { format: 'stream' })) chunks.push(c)
      return concat(chunks)
    }, same],
    read_text: [() => sbx.files.read('/tmp/bench.txt'), (t) => t === text],
    read_node_http: [rawGet, (b) => b !== null && same(b)],
  }
  for (const k of Object.keys(ways)) out[k] = []
  for (const k of Object.keys(ways)) out[k + '_cpu_ms'] = []
  // interleaved, so that a change of the machine's load falls on every way alike;
  // this process's CPU time too, which the machine's load does not change much
  for (let i = 0; i < N_READ; i++) {
    for (const [k, [read, ok]] of Object.entries(ways)) {
      const t0 = now()
      const c0 = process.cpuUsage()
      const got = await read()
      const c = process.cpuUsage(c0)
      out[k].push((now() - t0) / 1e3)
      out[k + '_cpu_ms'].push((c.user + c.system) / 1e3)
      if (!ok(got)) fail(k + ' read back')
    }
  }
  out.bytes = data.length
  await sbx.kill()
  if (CODE) {
    const { Sandbox: CodeSandbox } = await import('@e2b/code-interpreter')
    const c = await CodeSandbox.create(CODE, { timeoutMs: 3600 * 1000, requestTimeoutMs: 900 * 1000 })
    out.run_code = []
    await c.runCode('1+1', { timeoutMs: 900 * 1000, requestTimeoutMs: 900 * 1000 }) // the kernel's first run
    for (let i = 0; i < N_CODE; i++) {
      const t0 = now()
      const ex = await c.runCode('1+1')
      out.run_code.push(now() - t0)
      if (ex.text !== '2') fail('runCode', { ex: ex.toJSON ? ex.toJSON() : String(ex) })
    }
    await c.kill()
  }
  console.log(JSON.stringify(out))
}

main().catch((e) => fail(String(e), { stack: e.stack }))
