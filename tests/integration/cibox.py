"""One warrend for every test class of the code-interpreter template in a process.

Its pool holds clones of a template whose kernel was started and warmed once
(docs/KERNELD.md), so each class gets a sandbox with a live kernel in seconds
instead of booting one and starting Python (minutes under TCG). ctest runs the
code-interpreter modules in one process (integration_code in CMakeLists.txt);
run alone, a module starts the daemon itself all the same.

A class that needs another configuration (a broken warm hook, say) starts a
warrend of its own, as any WarrenCase does."""
import atexit
import os
import time

from warren import Warren, WarrenCase, image_dir

TEMPLATE = "code-interpreter"

# The pool holds the template at its own memory (template_memory_mb): creates that ask
# for nothing else get a warm clone. Jail off: the pool's clones then cost their RAM
# file once, not once more each (pool_max_mb).
CONF = {"pool_size": "2", "jail": "off", "default_template": TEMPLATE,
        "pool_on_first_use": "false", "pool_max_mb": "4096", "boot_timeout_seconds": "300"}

_shared = None


def have_template(name=TEMPLATE):
    return os.path.exists(os.path.join(image_dir(), f"{name}.ext4"))


def shared():
    """The process's code-interpreter warrend, started on first use."""
    global _shared
    if _shared is None:
        if not have_template():
            raise RuntimeError(f"no {TEMPLATE}.ext4 in {image_dir()} (run images/build.sh)")
        _shared = Warren(CONF).start()
        atexit.register(_shared.cleanup)
        t0, _shared.pool_ready_s = time.time(), 0.0
        wait_pool(_shared)
        _shared.pool_ready_s = time.time() - t0
    return _shared


def wait_pool(w, n=1, timeout=1800):
    """Until the pool has n clones ready. A create before that boots a VM and warms its
    kernel beside the template's own warm-up: two kernel starts at once on two cores,
    each minutes under TCG, where a pool clone takes a second. A pool that is off (no
    image) is left to the creates, which say why they fail."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = w.request("GET", "/healthz")
        p = r.json().get("pool") if r.status == 200 else None
        if p and (p["state"] == "off" or (p["state"] == "ready" and p["ready"] >= n)):
            return p
        time.sleep(0.5)
    raise AssertionError(f"the pool never had {n} ready in {timeout} s\n{w.log_text()}")


def delete_all(w):
    """Every sandbox the daemon has (the pool's waiting VMs are not sandboxes)."""
    r = w.request("GET", "/v1/sandboxes")
    for s in r.json().get("sandboxes", []) if r.status == 200 else []:
        if s["state"] not in ("ended", "dead"):
            w.delete(s["id"])


class CodeCase(WarrenCase):
    """A test class on the shared code-interpreter warrend: its sandboxes go at its end,
    the daemon and its pool stay for the next class."""

    @classmethod
    def setUpClass(cls):
        cls.w = shared()

    @classmethod
    def tearDownClass(cls):
        if cls.w.proc and cls.w.proc.poll() is None:
            delete_all(cls.w)
