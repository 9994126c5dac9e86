// deploy/check.mjs - check the deploy files without a cluster: every Kubernetes
// object against its schema (the kubernetes-models package), then what Warren
// itself relies on, which no schema knows: the pod runs on the host network,
// privileged, with its host id from the downward API; every volume a container
// mounts exists and names are unique; the ConfigMap's warren.conf is what
// warrend accepts (checked by `warrend --check-config` in check.sh); the Nomad
// job parses as HCL2 and has the same settings.
//
//   NODE_MODULES=<dir> node deploy/check.mjs OUTDIR FILE...
// Writes each embedded warren.conf to OUTDIR/<n>.conf for check.sh.
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const nm = process.env.NODE_MODULES;
if (!nm) throw new Error("NODE_MODULES is not set");
const req = createRequire(join(nm, "check.js"));
// require.resolve finds a package's CommonJS entry: its names are then on default.
const load = async (name) => {
  const m = await import(pathToFileURL(req.resolve(name)).href);
  return m.default && Object.keys(m).length <= 2 ? { ...m.default, ...m } : m;
};
const { parseAllDocuments } = await load("yaml");
const apps = await load("kubernetes-models/apps/v1");
const core = await load("kubernetes-models/v1");
const { parse: parseHcl } = await load("@cdktf/hcl2json");

const kinds = {
  StatefulSet: apps.StatefulSet,
  DaemonSet: apps.DaemonSet,
  Deployment: apps.Deployment,
  ConfigMap: core.ConfigMap,
  Service: core.Service,
};
const [outDir, ...files] = process.argv.slice(2);
let confs = 0;
let failures = 0;
const fail = (where, msg) => {
  console.error(`FAIL ${where}: ${msg}`);
  failures++;
};
const unique = (where, list, what) => {
  const seen = new Set();
  for (const x of list || []) {
    if (seen.has(x.name)) fail(where, `${what} ${x.name} appears twice`);
    seen.add(x.name);
  }
};

function checkWarrenPod(where, spec, claims) {
  if (spec.hostNetwork !== true) fail(where, "warrend must run on the host network");
  const vols = new Set((spec.volumes || []).map((v) => v.name));
  for (const c of claims || []) vols.add(c.metadata.name);
  unique(where, spec.volumes, "volume");
  const c = (spec.containers || []).find((x) => x.name === "warrend");
  if (!c) return fail(where, "no container named warrend");
  if (!c.securityContext || c.securityContext.privileged !== true)
    fail(where, "warrend needs a privileged container (/dev/kvm, taps, netns, cgroups)");
  unique(where, c.volumeMounts, "volume mount");
  for (const m of c.volumeMounts || [])
    if (!vols.has(m.name)) fail(where, `mount ${m.name} names no volume`);
  const env = (c.env || []).find((e) => e.name === "WARREN_HOST_ID");
  if (!env || !env.valueFrom || !env.valueFrom.fieldRef)
    fail(where, "WARREN_HOST_ID must come from the downward API");
  const mounts = new Set((c.volumeMounts || []).map((m) => m.mountPath));
  for (const p of ["/var/lib/warren", "/dev/kvm", "/etc/warren/secret"])
    if (!mounts.has(p)) fail(where, `nothing mounted at ${p}`);
}

for (const f of files) {
  const text = readFileSync(f, "utf8");
  if (f.endsWith(".hcl")) {
    const j = await parseHcl(f, text);
    const job = j.job && j.job.warren && j.job.warren[0];
    if (!job) {
      fail(f, 'no job "warren"');
      continue;
    }
    if (job.type !== "system") fail(f, "the job must be a system job (one warrend per node)");
    const task = job.group.warrend[0].task.warrend[0];
    if (task.driver !== "raw_exec") fail(f, "warrend runs as root on the node (raw_exec)");
    if (!task.env || !task.env[0].WARREN_HOST_ID) fail(f, "no WARREN_HOST_ID");
    for (const t of task.template) {
      if (t.destination.endsWith("warren.conf")) {
        // Nomad's template language: the secrets directory is its own.
        const conf = t.data.replace(/\{\{ env "NOMAD_SECRETS_DIR" \}\}/g, "/tmp/secrets");
        writeFileSync(join(outDir, `${confs++}.conf`), conf);
      }
    }
    console.log(`ok ${f}: job warren (system, raw_exec)`);
    continue;
  }
  for (const d of parseAllDocuments(text)) {
    if (d.errors.length) {
      fail(f, d.errors[0].message);
      continue;
    }
    const o = d.toJS();
    if (!o) continue;
    const K = kinds[o.kind];
    const where = `${f}: ${o.kind} ${o.metadata && o.metadata.name}`;
    if (!K) {
      fail(where, "a kind this check does not know");
      continue;
    }
    try {
      new K(o).validate();
    } catch (e) {
      fail(where, `schema: ${e.message}`);
      continue;
    }
    if ((o.kind === "StatefulSet" || o.kind === "DaemonSet") && o.metadata.name === "warren")
      checkWarrenPod(where, o.spec.template.spec, o.spec.volumeClaimTemplates);
    if (o.kind === "ConfigMap" && o.data && o.data["warren.conf"])
      writeFileSync(join(outDir, `${confs++}.conf`), o.data["warren.conf"]);
    console.log(`ok ${where}`);
  }
}
if (failures) {
  console.error(`${failures} failure(s)`);
  process.exit(1);
}
