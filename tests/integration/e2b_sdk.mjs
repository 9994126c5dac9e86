// E2B's unmodified JS SDK (npm e2b@2.51.0) against a live warrend: the control
// plane only (create, list with paging and a metadata filter, getInfo,
// setTimeout, pause and connect, snapshots, kill, errors). Run by
// test_e2b.py with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY pointing at
// warrend and NODE_PATH at setup.sh's npm cache. Prints one JSON line per
// check ({"check": name, "ok": bool, ...}) and exits non-zero on the first
// failure.
//
// The data plane is elsewhere: commands, pty and files in e2b_envd.mjs, with
// getHost and a request through the port proxy, and a command's connect after
// a kill -9 of warrend (test_envd.py's EnvdSdkTest); runCode and contexts in
// e2b_code.mjs.
import { Sandbox, SandboxNotFoundError, AuthenticationError } from 'e2b'

const TEMPLATE = process.env.E2B_TEST_TEMPLATE || 'base'
const TIMEOUT_MS = 3600 * 1000

function check(name, ok, extra = {}) {
  console.log(JSON.stringify({ check: name, ok: !!ok, ...extra }))
  if (!ok) process.exit(1)
}

async function listAll(opts) {
  const pages = []
  const p = Sandbox.list(opts)
  while (p.hasNext) {
    pages.push(await p.nextItems())
    if (pages.length > 50) throw new Error('paging never ends')
  }
  return pages
}

async function main() {
  const tag = `run-${process.pid}`
  // create: three sandboxes, two of them tagged
  const a = await Sandbox.create(TEMPLATE, { timeoutMs: TIMEOUT_MS, metadata: { suite: tag, who: 'a b&c=d' } })
  const b = await Sandbox.create(TEMPLATE, { timeoutMs: TIMEOUT_MS, metadata: { suite: tag, who: 'b' } })
  const c = await Sandbox.create(TEMPLATE, { timeoutMs: TIMEOUT_MS, metadata: { suite: 'other' } })
  check('create', a.sandboxId && b.sandboxId && c.sandboxId && a.sandboxId !== b.sandboxId, { ids: [a.sandboxId, b.sandboxId, c.sandboxId] })

  // getInfo
  const info = await Sandbox.getInfo(a.sandboxId)
  check('getInfo', info.sandboxId === a.sandboxId && info.state === 'running' &&
    info.metadata.suite === tag && info.metadata.who === 'a b&c=d' &&
    info.envdVersion === '0.5.7' && info.cpuCount >= 1 && info.memoryMB >= 64 &&
    !isNaN(info.startedAt.getTime()) && info.endAt > info.startedAt, { info })
  const info2 = await a.getInfo()
  check('instance getInfo', info2.sandboxId === a.sandboxId)

  // list: pages of one, every sandbox exactly once
  const pages = await listAll({ limit: 1 })
  const ids = pages.flat().map((s) => s.sandboxId)
  check('list paging', pages.length >= 3 && pages.every((p) => p.length <= 1) &&
    new Set(ids).size === ids.length && [a, b, c].every((s) => ids.includes(s.sandboxId)), { pages: pages.length, ids })

  // list: a metadata filter (with characters that need escaping)
  const tagged = (await listAll({ query: { metadata: { suite: tag } } })).flat().map((s) => s.sandboxId).sort()
  check('list metadata filter', JSON.stringify(tagged) === JSON.stringify([a.sandboxId, b.sandboxId].sort()), { tagged })
  const odd = (await listAll({ query: { metadata: { who: 'a b&c=d' } } })).flat().map((s) => s.sandboxId)
  check('list metadata filter escaped', odd.length === 1 && odd[0] === a.sandboxId, { odd })

  // setTimeout: the end moves
  const before = (await Sandbox.getInfo(b.sandboxId)).endAt
  await b.setTimeout(7200 * 1000)
  const after = (await Sandbox.getInfo(b.sandboxId)).endAt
  check('setTimeout', after.getTime() - before.getTime() > 3000 * 1000, { before, after })

  // pause, then connect (resume) with a new timeout
  check('pause', (await b.pause()) === true)
  check('paused state', (await Sandbox.getInfo(b.sandboxId)).state === 'paused')
  check('pause again is false', (await Sandbox.pause(b.sandboxId)) === false)
  const paused = (await listAll({ query: { state: ['paused'] } })).flat().map((s) => s.sandboxId)
  check('list state filter', paused.includes(b.sandboxId) && !paused.includes(a.sandboxId), { paused })
  const b2 = await Sandbox.connect(b.sandboxId, { timeoutMs: TIMEOUT_MS })
  check('connect resumes', b2.sandboxId === b.sandboxId && (await Sandbox.getInfo(b.sandboxId)).state === 'running')
  const b3 = await Sandbox.connect(b.sandboxId)
  check('connect running', b3.sandboxId === b.sandboxId)

  // snapshots: take one, list it, create from it, delete it
  const snap = await a.createSnapshot({ name: 'snap-one' })
  check('createSnapshot', typeof snap.snapshotId === 'string' && snap.names.includes('snap-one'), { snap })
  const snaps = (await (async () => {
    const out = []
    const p = Sandbox.listSnapshots({ sandboxId: a.sandboxId })
    while (p.hasNext) out.push(...(await p.nextItems()))
    return out
  })()).map((s) => s.snapshotId)
  check('listSnapshots', snaps.includes(snap.snapshotId), { snaps })
  const fromSnap = await Sandbox.create(snap.snapshotId, { timeoutMs: TIMEOUT_MS })
  check('create from snapshot', (await Sandbox.getInfo(fromSnap.sandboxId)).state === 'running')
  await fromSnap.kill()
  // the sandbox made from it is gone: the snapshot can go
  let deleted = false
  for (let i = 0; i < 50 && !deleted; i++) {
    try {
      deleted = await Sandbox.deleteSnapshot(snap.snapshotId)
    } catch (e) {
      await new Promise((r) => setTimeout(r, 200))
    }
  }
  check('deleteSnapshot', deleted)
  check('deleteSnapshot unknown', (await Sandbox.deleteSnapshot(snap.snapshotId)) === false)

  // fork: two children, each its own sandbox with the parent's metadata
  const forks = await Sandbox.fork(a.sandboxId, { count: 2, timeoutMs: TIMEOUT_MS })
  check('fork', forks.length === 2 && forks.every((f) => !(f instanceof Error) && f.sandboxId !== a.sandboxId) &&
    forks[0].sandboxId !== forks[1].sandboxId, { forks: forks.map((f) => f.sandboxId || String(f)) })
  const finfo = await Sandbox.getInfo(forks[0].sandboxId)
  check('fork info', finfo.state === 'running' && finfo.metadata.suite === tag, { finfo })
  for (const f of forks) await f.kill()

  // kill
  check('kill', (await Sandbox.kill(c.sandboxId)) === true)
  check('kill unknown', (await Sandbox.kill(c.sandboxId)) === false)
  let nf = false
  try {
    await Sandbox.getInfo(c.sandboxId)
  } catch (e) {
    nf = e instanceof SandboxNotFoundError
  }
  check('getInfo of a killed sandbox', nf)
  nf = false
  try {
    await Sandbox.connect('sb-doesnotexist00')
  } catch (e) {
    nf = e instanceof SandboxNotFoundError
  }
  check('connect unknown', nf)

  // a wrong key
  let auth = false
  try {
    await Sandbox.list({ apiKey: 'e2b_00' }).nextItems()
  } catch (e) {
    auth = e instanceof AuthenticationError
  }
  check('bad key', auth)

  await a.kill()
  await b.kill()
  check('done', true)
}

main().catch((e) => {
  console.log(JSON.stringify({ check: 'exception', ok: false, error: String(e && e.stack || e) }))
  process.exit(1)
})
