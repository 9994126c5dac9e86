// E2B's unmodified code interpreter SDK (npm @e2b/code-interpreter@2.8.0) against a
// live warrend: Sandbox.create of code-interpreter-v1, runCode with its callbacks,
// state across runs, errors, rich results, envs, contexts (create, run in, list,
// restart, remove), unknown contexts and languages, and an aborted run that must
// not hold its context. Run by test_e2b_code.py with E2B_API_URL, E2B_SANDBOX_URL
// and E2B_API_KEY pointing at warrend. Prints one JSON line per check ({"check":
// name, "ok": bool, ...}) and exits non-zero on the first failure; leaves the
// sandbox running for the Python side's raw checks (warrend's end kills it).
import { Sandbox, NotFoundError, SandboxError, TimeoutError } from '@e2b/code-interpreter'

const LONG = 20 * 60 * 1000 // a kernel's cold start under TCG takes minutes

function check(name, ok, extra = {}) {
  console.log(JSON.stringify({ check: name, ok: !!ok, ...extra }))
  if (!ok) process.exit(1)
}

async function rejects(p) {
  try {
    await p
    return null
  } catch (e) {
    return e
  }
}

async function main() {
  const sbx = await Sandbox.create('code-interpreter-v1', { timeoutMs: 3600 * 1000, requestTimeoutMs: LONG })
  check('create', !!sbx.sandboxId, {
    sandboxId: sbx.sandboxId, trafficAccessToken: sbx.trafficAccessToken, envdAccessToken: sbx.envdAccessToken,
  })
  const run = (code, opts = {}) => sbx.runCode(code, { requestTimeoutMs: LONG, timeoutMs: LONG, ...opts })

  // state kept across runs of the default context
  const a = await run('x = 41')
  check('runCode assign', !a.error && a.results.length === 0, { a: a.toJSON() })
  const b = await run('x + 1')
  check('runCode state kept', b.text === '42' && b.results[0].isMainResult && !b.error, { b: b.toJSON() })

  // stdout and stderr callbacks, as they come, and in the execution's logs
  const outs = [], errs = []
  const c = await run('import sys\nprint("out-1")\nprint("err-1", file=sys.stderr)\nprint("out-2")', {
    onStdout: (m) => outs.push(m.line), onStderr: (m) => errs.push(m.line),
  })
  check('stdout callback', outs.join('') === 'out-1\nout-2\n' && c.logs.stdout.join('') === 'out-1\nout-2\n', { outs, logs: c.logs })
  check('stderr callback', errs.join('') === 'err-1\n' && c.logs.stderr.join('') === 'err-1\n', { errs })

  // an error: onError, and the execution's error
  let seen = null
  const d = await run('1/0', { onError: (e) => { seen = e } })
  check('error', d.error && d.error.name === 'ZeroDivisionError' && seen && seen.name === 'ZeroDivisionError' &&
    d.error.traceback.includes('ZeroDivisionError'), { error: d.error })

  // a rich result
  const res = []
  const e = await run('from IPython.display import HTML\nHTML("<b>hi</b>")', { onResult: (r) => res.push(r) })
  check('html result', e.results.length === 1 && e.results[0].html === '<b>hi</b>' && res.length === 1 &&
    res[0].html === '<b>hi</b>' && e.results[0].formats().includes('html'), { e: e.toJSON() })

  // envs: set for the run only
  const f = await run('import os\nprint(os.environ.get("WARREN_E2B_T", "unset"))', { envs: { WARREN_E2B_T: 'v-1' } })
  const g = await run('import os\nprint(os.environ.get("WARREN_E2B_T", "unset"))')
  check('envs', f.logs.stdout.join('') === 'v-1\n' && g.logs.stdout.join('') === 'unset\n', { f: f.logs, g: g.logs })

  // a language: bash's default context
  const h = await run('echo "bash $((6 * 7))"', { language: 'bash' })
  check('language bash', h.logs.stdout.join('') === 'bash 42\n', { h: h.toJSON() })

  // a context of its own, python as the SDK's default: a kernel started for it, its cwd,
  // its own variables (not the default context's), listed, restarted, removed.
  const ctx = await sbx.createCodeContext({ cwd: '/tmp', requestTimeoutMs: LONG })
  check('createCodeContext', ctx.id && ctx.language === 'python' && ctx.cwd === '/tmp', { ctx })
  const i = await run('import os\nprint(os.getcwd())\nY = 5', { context: ctx })
  check('runCode in context', i.logs.stdout.join('') === '/tmp\n' && !i.error, { i: i.toJSON() })
  const j = await run('print(Y * 2)', { context: ctx })
  const jd = await run('Y')
  check('context state kept', j.logs.stdout.join('') === '10\n' && jd.error && jd.error.name === 'NameError',
    { j: j.toJSON(), jd: jd.toJSON() })
  const list = await sbx.listCodeContexts()
  check('listCodeContexts', Array.isArray(list) && list.some((c) => c.id === ctx.id && c.cwd === '/tmp' && c.language === 'python') &&
    list.filter((c) => c.language === 'python').length >= 2, { list })
  await sbx.restartCodeContext(ctx)
  const k = await run('print(globals().get("Y", "unset"))', { context: ctx })
  check('restartCodeContext', k.logs.stdout.join('') === 'unset\n', { k: k.toJSON() })
  await sbx.removeCodeContext(ctx.id)
  const list2 = await sbx.listCodeContexts()
  check('removeCodeContext', !list2.some((c) => c.id === ctx.id), { list2 })

  // unknown context: NotFoundError (also the one just removed)
  const nf = await rejects(run('1', { context: { id: 'no-such-context', language: 'python', cwd: '/' } }))
  check('unknown context', nf instanceof NotFoundError, { err: String(nf) })
  const nf2 = await rejects(run('1', { context: ctx }))
  check('removed context', nf2 instanceof NotFoundError, { err: String(nf2) })
  const nf3 = await rejects(sbx.removeCodeContext('no-such-context'))
  check('remove unknown context', nf3 instanceof NotFoundError, { err: String(nf3) })

  // a language with no kernel here: an error, never a hang
  const nk = await rejects(run('1', { language: 'r' }))
  check('unknown language', nk instanceof SandboxError && !(nk instanceof NotFoundError) && String(nk).includes('500'), { err: String(nk) })

  // a run the client abandons (its timeoutMs) is interrupted: the context is free again
  const ab = await rejects(run('import time\ntime.sleep(900)', { timeoutMs: 5000 }))
  check('abort', ab instanceof TimeoutError, { err: String(ab) })
  const l = await run('x + 1', { timeoutMs: 300 * 1000 })
  check('context free after abort', l.text === '42', { l: l.toJSON() })

  check('done', true)
  // a request the SDK refused leaves its request timer armed (LONG): do not wait for it
  process.exit(0)
}

main().catch((e) => {
  console.log(JSON.stringify({ check: 'exception', ok: false, error: String(e), stack: e && e.stack }))
  process.exit(1)
})
