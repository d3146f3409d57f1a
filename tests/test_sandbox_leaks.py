"""Cross-job leak suite for the warm sandboxes (issue 25), on every backend offered by default.

A warm sandbox runs job after job in the same long-lived container (docker) or bubblewrap
namespace (bwrap). Each test here runs one program that tries to leave something behind --
files in /tmp, the work dir and home, background and daemonised processes, environment
variables, a full disk, an edited module on the import path, listening sockets, SysV IPC,
interpreter state, a fork bomb -- and then, in the *same* warm sandbox (pool of one runner), a second
program that looks for it and must see none of it and run normally.

Where the runner can clean up in place, the test also checks that it did (the same runner
served both jobs); where it cannot (SysV IPC objects, a pids-limit breach), it must have
recycled the runner instead. Real Docker daemon and real bwrap; docker tests skip only when no
Docker daemon answers (CI starts one with scripts/setup.sh), and fail on any other problem.
"""
from __future__ import annotations

import json

import pytest

from agentgym.envs.services.sandbox import SandboxError, available_backends, make_sandbox

BACKENDS = ["docker", "bwrap"]


def _open(backend: str):
    if backend == "docker":
        status = available_backends()["docker"]
        if "not reachable" in status:
            pytest.skip(f"no Docker daemon here ({status}); scripts/setup_docker.sh starts one")
        if status != "ok":
            pytest.fail(f"docker sandbox unavailable: {status}", pytrace=False)
    return make_sandbox(backend, pool_size=1, max_output_bytes=64 * 1024)


@pytest.fixture(scope="module")
def warm():
    opened: dict = {}

    def get(backend: str):
        if backend not in opened:
            opened[backend] = _open(backend)
        return opened[backend]

    yield get
    for sb in opened.values():
        sb.close()


# (program that leaves something behind, program that looks for it and prints JSON {ok: bool, ...},
#  whether the same runner must have served both)
LEAKS: dict[str, tuple[str, str, bool]] = {
    "files": ("""
import os
for d in ('/tmp', '.', os.path.expanduser('~'), '/dev/shm', '/tmp/sub/deeper'):
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, 'leak.txt'), 'w').write('left behind')
os.makedirs('locked/inner')
open('locked/inner/f', 'w').write('x')
os.chmod('locked/inner', 0)
os.chmod('locked', 0)
""", """
import json, os
seen = {d: sorted(os.listdir(d)) for d in ('/tmp', '.', os.path.expanduser('~'), '/dev/shm')}
print(json.dumps({"ok": seen['/tmp'] == [] and seen['.'] == ['main.py'] and seen['/dev/shm'] == [], "seen": seen}))
""", True),
    "processes": ("""
import os, subprocess, sys, time
subprocess.Popen(['sleep', '600'])
subprocess.Popen(['sleep', '601'], start_new_session=True)
if os.fork() == 0:          # daemonise: fork, setsid, fork, close everything
    os.setsid()
    if os.fork() == 0:
        os.closerange(0, 3)
        while True:
            open('/tmp/daemon-alive', 'w').write(str(time.time()))
            time.sleep(0.05)
    os._exit(0)
time.sleep(0.2)
""", """
import json, os, time
time.sleep(0.3)
mine = {1, os.getppid(), os.getpid()}
others = []
for p in os.listdir('/proc'):
    if p.isdigit() and int(p) not in mine:
        try:
            others.append(open('/proc/%s/cmdline' % p, 'rb').read().replace(b'\\0', b' ').decode())
        except OSError:
            pass
print(json.dumps({"ok": not others and not os.path.exists('/tmp/daemon-alive'), "others": others}))
""", True),
    "environment": ("""
import os
os.environ['AGENTGYM_LEAK'] = '1'
os.putenv('AGENTGYM_LEAK2', '1')
os.environ['PATH'] = '/tmp/evil:' + os.environ['PATH']
open('sitecustomize.py', 'w').write('import os; os.environ["AGENTGYM_LEAK3"] = "1"')
open('/tmp/usercustomize.py', 'w').write('import os; os.environ["AGENTGYM_LEAK3"] = "1"')
""", """
import json, os
leaked = sorted(k for k in os.environ if k.startswith('AGENTGYM'))
print(json.dumps({"ok": not leaked and not os.environ['PATH'].startswith('/tmp'), "env": dict(os.environ)}))
""", True),
    "disk_quota": ("""
import os
for d in ('/tmp', '.'):
    i = 0
    try:
        while True:
            with open(os.path.join(d, 'fill%d' % i), 'wb') as f:
                for _ in range(8):
                    f.write(b'x' * (1 << 20))
            i += 1
    except OSError as e:
        print(d, 'full after', i, 'files:', e.strerror)
""", """
import json, os
wrote = {}
for d in ('/tmp', '.'):
    with open(os.path.join(d, 'ten_mb'), 'wb') as f:
        f.write(b'y' * (10 << 20))
    wrote[d] = os.path.getsize(os.path.join(d, 'ten_mb'))
print(json.dumps({"ok": all(v == 10 << 20 for v in wrote.values()), "wrote": wrote}))
""", True),
    "import_path": ("""
import json, os, sys
tried = {}
for d in sys.path:
    for name in ('agentgym_leakmod.py', 'json.py'):
        p = os.path.join(d or '.', name)
        try:
            open(p, 'w').write('LEAKED = True\\nraise SystemExit(99)\\n')
            tried[p] = 'written'
        except OSError as e:
            tried[p] = e.strerror
try:
    open(json.__file__, 'a').write('\\nraise SystemExit(98)\\n')
    tried['json'] = 'edited'
except OSError as e:
    tried['json'] = e.strerror
json.dumps = lambda *a, **k: 'evil'
os.makedirs(os.path.expanduser('~/.local/lib'), exist_ok=True)
print(tried)
""", """
import json, sys
try:
    import agentgym_leakmod
    found = True
except ImportError:
    found = False
print(json.dumps({"ok": not found and json.dumps([1]) == '[1]' and json.__file__.startswith('/usr'),
                  "json": json.__file__}))
""", True),
    "sockets": ("""
import os, socket, time
tcp = socket.socket()
tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tcp.bind(('127.0.0.1', 45678))
tcp.listen()
unix = socket.socket(socket.AF_UNIX)
unix.bind('\\0agentgym-leak')
unix.listen()
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(('127.0.0.1', 45679))
if os.fork() == 0:
    os.setsid()
    time.sleep(600)   # the daemon holds all three
""", """
import json, socket
out = {}
c = socket.socket()
c.settimeout(1)
try:
    c.connect(('127.0.0.1', 45678))
    out['connect'] = 'connected'
except OSError as e:
    out['connect'] = e.strerror
for name, fam, typ, addr in [('tcp', socket.AF_INET, socket.SOCK_STREAM, ('127.0.0.1', 45678)),
                             ('unix', socket.AF_UNIX, socket.SOCK_STREAM, '\\0agentgym-leak'),
                             ('udp', socket.AF_INET, socket.SOCK_DGRAM, ('127.0.0.1', 45679))]:
    s = socket.socket(fam, typ)
    try:
        s.bind(addr)
        out[name] = 'free'
    except OSError as e:
        out[name] = e.strerror
print(json.dumps({"ok": out == {'connect': 'Connection refused', 'tcp': 'free', 'unix': 'free', 'udp': 'free'},
                  **out}))
""", True),
    "interpreter_state": ("""
import builtins, os, sys
builtins.AGENTGYM_LEAKED = True
os.sep = '!'
sys.modules['agentgym_fake'] = sys
sys.setrecursionlimit(50)
kept = ['agentgym-leak'] * 12345
""", """
import builtins, gc, json, os, sys
live = any(isinstance(o, list) and len(o) == 12345 for o in gc.get_objects())
print(json.dumps({"ok": not hasattr(builtins, 'AGENTGYM_LEAKED') and os.sep == '/' and not live
                  and 'agentgym_fake' not in sys.modules and sys.getrecursionlimit() == 1000}))
""", True),
    "sysv_ipc": ("""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
shm = libc.shmget(0x4167_6701, 4096, 0o1666)   # IPC_CREAT | 0666: outlives every process
msg = libc.msgget(0x4167_6702, 0o1666)
print(shm, msg)
""", """
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
print(json.dumps({"ok": libc.shmget(0x4167_6701, 0, 0) == -1 and libc.msgget(0x4167_6702, 0) == -1}))
""", False),
    "fork_bomb": ("""
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
""", """
import json, subprocess
procs = [subprocess.Popen(['sleep', '0.2']) for _ in range(10)]
print(json.dumps({"ok": all(p.wait() == 0 for p in procs)}))
""", False),
}


@pytest.mark.parametrize("backend", [pytest.param(b, marks=[pytest.mark.docker] if b == "docker" else [])
                                     for b in BACKENDS])
@pytest.mark.parametrize("leak", list(LEAKS))
def test_next_job_sees_nothing(warm, backend, leak):
    sb = warm(backend)
    evil, check, in_place = LEAKS[leak]
    sb.run("pass")  # a runner is warm and idle
    started = sb._pool.started
    first = sb.run(evil, time_limit_s=1.5 if leak in ("fork_bomb", "processes", "sockets") else 10,
                   memory_mb=256)
    assert first.exit_code == 0 or leak == "fork_bomb", first
    after = sb.run(check, time_limit_s=10)
    assert after.ok, f"the next job did not run normally after {leak}: {after}"
    report = json.loads(after.stdout.strip().splitlines()[-1])
    assert report["ok"], f"{backend}: the next job saw what {leak} left: {report}"
    if in_place:
        assert sb._pool.started == started, f"{leak}: the runner was replaced, not cleaned in place"
    else:
        assert sb._pool.started > started, f"{leak}: a runner that could not be cleaned was kept"


@pytest.mark.parametrize("backend", [pytest.param(b, marks=[pytest.mark.docker] if b == "docker" else [])
                                     for b in BACKENDS])
def test_many_jobs_reuse_one_runner_and_max_jobs_recycles(backend):
    sb = _open(backend)
    sb.max_jobs = 5
    try:
        outs = [sb.run(f"print({i})").stdout for i in range(12)]
        assert outs == [f"{i}\n" for i in range(12)]
        assert sb.recycled.get("max_jobs") == 2 and sb._pool.started <= 4
    finally:
        sb.close()


@pytest.mark.parametrize("backend", [pytest.param(b, marks=[pytest.mark.docker] if b == "docker" else [])
                                     for b in BACKENDS])
def test_run_batch_each_job_its_own_limits_and_result(warm, backend):
    sb = warm(backend)
    results = sb.run_batch([
        {"code": "print(input() * 2)", "stdin": "ab"},
        {"code": "while True: pass", "time_limit_s": 0.5},
        {"code": "import sys; open('x', 'w'); sys.exit(4)"},
        {"code": "import os; print(os.listdir('.'))", "files": {"a.txt": "1"}},
        {"code": "x = []\nwhile True: x.append(bytearray(10**7))", "memory_mb": 64},
        {"code": "print(7)"},
    ])
    assert [r.stdout for r in results[:1]] == ["abab\n"]
    assert results[1].timed_out and results[1].exit_code is None
    assert results[2].exit_code == 4
    assert sorted(eval(results[3].stdout)) == ['a.txt', 'main.py']  # 'x' from the job before is gone
    assert results[4].oom and not results[4].timed_out
    assert results[5].stdout == "7\n" and len(results) == 6
    with pytest.raises(ValueError, match="needs 'code'"):
        sb.run_batch([{"stdin": "x"}])


def test_a_job_killing_its_supervisor_is_a_verdict_not_an_error(warm):
    """bwrap jobs share the runner's uid: kill(-1) reaches the handler (never the zygote)."""
    sb = warm("bwrap")
    r = sb.run("import os, signal\nos.kill(-1, signal.SIGKILL)", time_limit_s=5)
    assert r.exit_code is None and not r.ok
    assert sb.run("print(6 * 7)").stdout == "42\n"
    # in a batch, only the guilty job gets that verdict; the jobs around it run normally
    results = sb.run_batch([{"code": "print(1)"}, {"code": "import os, signal\nos.kill(-1, signal.SIGKILL)"},
                            {"code": "print(2)"}])
    assert [r.stdout for r in results] == ["1\n", "", "2\n"] and results[1].exit_code is None
    assert results[0].ok and results[2].ok


def test_closed_warm_sandbox_raises(warm):
    sb = _open("bwrap")
    sb.close()
    with pytest.raises(SandboxError, match="closed"):
        sb.run_batch([{"code": "pass"}])


@pytest.mark.parametrize("backend", [pytest.param(b, marks=[pytest.mark.docker] if b == "docker" else [])
                                     for b in BACKENDS])
def test_preloaded_modules_are_fresh_per_job(warm, backend):
    """Jobs inherit preloaded modules (unittest, random, ...) from the runner, but not their state:
    random is reseeded in every job, and a job's changes to a preloaded module do not reach the next."""
    sb = warm(backend)
    draws = {sb.run("import random; print(random.random())").stdout for _ in range(3)}
    assert len(draws) == 3
    sb.run("import unittest, json; unittest.TestCase.run = None; json.loads = None")
    r = sb.run("import json, unittest\n"
               "class T(unittest.TestCase):\n"
               "    def test(self):\n"
               "        self.assertEqual(json.loads('[1]'), [1])\n"
               "unittest.main(argv=['t'])")
    assert r.ok and "OK" in r.stderr, r
