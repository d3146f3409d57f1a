"""Test harness that runs *inside* the sandbox: one sandbox run grades one attempt.

The env prepends ``PAYLOAD = "<json>"`` (limits and a list of jobs: solution source + test cases)
to this file's source and runs the result as a script. Standard library only, Python >= 3.8, POSIX (``os.fork``).

Why fork per test: each test case runs in its own child process, so a test that crashes, loops,
calls ``sys.exit``/``os._exit``, mutates globals or floods stdout cannot affect the others, and the
solution's code never runs in the process that writes the report (it cannot print a fake report:
children's stdout/stderr go to files, and the report is the parent's last stdout line). Forking is
~1 ms, so all tests of an attempt, stdin/stdout tests included (their stdin is a real fd 0), cost
one interpreter start instead of one per test.

For function-style problems the solution is first loaded alone (``load`` check): if importing it
fails or hangs, every assert test fails with that one error instead of timing out once per test.

The tests are kept out of the program's easy reach: the script deletes its own file (``main.py``
holds the payload) and each child forgets all test data before the solution runs. This guards
against accidents and casual reward hacks, not against a program that deliberately attacks the
harness (walking interpreter frames, writing to an inherited descriptor); the sandbox is the
security boundary.
"""

import ast
import json
import linecache
import os
import signal
import sys
import tempfile
import time
import traceback

try:
    import resource
except ImportError:  # not POSIX: output size is then unlimited
    resource = None

REPORT_MARK = "@@AGENTGYM_CODEEXEC_REPORT@@"

_dumps, _loads, _write, _exit, _fork = json.dumps, json.loads, os.write, os._exit, os.fork
_HARNESS_FILE = sys._getframe().f_code.co_filename
_BUILTIN_TYPES = (int, float, complex, str, bytes, bool, list, tuple, dict, set, frozenset, type(None))


def _cut(text, limit):
    """Keep the head and the tail (errors are usually at the end) of long text."""
    if text is None or len(text) <= limit:
        return text
    half = max(1, limit // 2)
    return text[:half] + "\n... [%d characters cut] ...\n" % (len(text) - 2 * half) + text[-half:]


def _short_repr(value, limit):
    try:
        r = repr(value)
    except BaseException as e:  # a user __repr__ may raise
        r = "<unprintable %s: %s>" % (type(value).__name__, type(e).__name__)
    return _cut(r, limit)


def _error(exc, limit):
    """Exception as data: type, message and the frames outside this harness."""
    frames = []
    tb = exc.__traceback__
    for fs in traceback.extract_tb(tb):
        if fs.filename == _HARNESS_FILE:
            continue
        frames.append([fs.filename, fs.lineno, fs.name, (fs.line or "")[:200]])
    try:
        message = str(exc)
    except BaseException:
        message = "<unprintable message>"
    return {"type": type(exc).__name__, "message": _cut(message, limit), "frames": frames[-8:]}


def _register_source(filename, source):
    """Let tracebacks show lines of exec'd code (solution and tests)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)


class _Failed(Exception):
    pass


def _run_assert(source, filename, ns, limit):
    """Run one assert-style test in ``ns``. A single ``assert a == b`` is evaluated side by side so the
    failure can say what the left side was (repair feedback), and a solution-defined object that claims
    equality with a builtin value (the ``__eq__``-returns-True hack) does not pass."""
    tree = ast.parse(source, filename)
    body = tree.body
    if (len(body) >= 1 and isinstance(body[-1], ast.Assert) and isinstance(body[-1].test, ast.Compare)
            and len(body[-1].test.ops) == 1 and isinstance(body[-1].test.ops[0], ast.Eq)):
        node = body[-1]
        if len(body) > 1:
            exec(compile(ast.Module(body=body[:-1], type_ignores=[]), filename, "exec"), ns)
        left = eval(compile(ast.Expression(node.test.left), filename, "eval"), ns)
        right = eval(compile(ast.Expression(node.test.comparators[0]), filename, "eval"), ns)
        if isinstance(right, _BUILTIN_TYPES) and type(left) is not type(right):
            mod = getattr(type(left), "__module__", "")
            if mod in (ns.get("__name__"), "__main__", "solution"):  # also catches `class X(int)` tricks
                raise _Failed("got a %s object (defined by the solution) where a %s was expected"
                              % (type(left).__name__, type(right).__name__))
        if not left == right:
            msg = ""
            if node.msg is not None:
                try:
                    msg = str(eval(compile(ast.Expression(node.msg), filename, "eval"), ns))
                except BaseException:
                    msg = ""
            raise _Failed((msg + "\n" if msg else "") + "left side was " + _short_repr(left, limit)
                          + ", expected " + _short_repr(right, limit))
        return
    exec(compile(tree, filename, "exec"), ns)


def _scrub(P, test):
    """Forget every test's data in this child before the solution runs, so the program cannot simply
    read the hidden tests or expected outputs (``import __main__; __main__.PAYLOAD``)."""
    for key in ("jobs", "tests"):
        if isinstance(P.get(key), list):
            del P[key][:]
    P.clear()
    test.clear()
    globals()["PAYLOAD"] = None


def _child(P, test, index, result_path):
    """Body of the child process for one test (never returns)."""
    limit, solution, setup = P["max_error_chars"], P["solution"], P.get("setup") or ""
    kind, test_code = test["kind"], test.get("code", "")
    _scrub(P, test)
    result = {"ok": False}
    try:
        ns = {"__name__": "__main__" if kind == "io" else "solution", "__builtins__": __builtins__}
        sys.argv = ["solution.py"]
        _register_source("solution.py", solution)
        code = compile(solution, "solution.py", "exec")
        try:
            exec(code, ns)
        except SystemExit as e:
            if kind != "io":
                raise
            if e.code not in (None, 0):
                result = {"ok": False, "error": {"type": "SystemExit", "message": "the program exited with status %r"
                                                 % (e.code,), "frames": []}}
                raise _Done()
        if kind == "assert":
            if setup:
                exec(compile(setup, "<setup>", "exec"), ns)
            name = "<test %d>" % index
            _register_source(name, test_code)
            _run_assert(test_code, name, ns, limit)
        result = {"ok": True}
    except _Done:
        pass
    except _Failed as e:
        result = {"ok": False, "error": {"type": "AssertionError", "message": str(e), "frames": []}}
    except BaseException as e:  # noqa: B902 - SystemExit, KeyboardInterrupt: all are test failures
        result = {"ok": False, "error": _error(e, limit)}
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    try:
        fd = os.open(result_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        _write(fd, _dumps(result).encode("utf-8", "replace"))
        os.close(fd)
    finally:
        _exit(0)


class _Done(Exception):
    pass


def _read(path, limit):
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return "", False
    return data[:limit].decode("utf-8", "replace"), len(data) > limit


def _wait(pid, deadline):
    """Wait for the child until ``deadline``: (status, timed_out). A pidfd wakes us the moment the
    child exits (Linux >= 5.3); elsewhere poll with a short, growing sleep."""
    try:
        import select
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError, ImportError):
        pidfd = None
    if pidfd is not None:
        try:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or poller.poll(max(1, int(left * 1000))):
                    break
        finally:
            os.close(pidfd)
        wpid, status = os.waitpid(pid, os.WNOHANG)
        return status, not wpid
    delay = 0.0002
    while True:
        wpid, status = os.waitpid(pid, os.WNOHANG)
        if wpid:
            return status, False
        if time.monotonic() >= deadline:
            return 0, True
        time.sleep(delay)
        delay = min(delay * 2, 0.005)


def _run_test(P, test, index, workdir, time_limit):
    """Fork a child for one test, wait with a wall-clock limit, collect its result and output."""
    paths = [os.path.join(workdir, "%s_%d" % (name, index)) for name in ("stdin", "out", "err", "result")]
    stdin_path, out_path, err_path, result_path = paths
    with open(stdin_path, "w", encoding="utf-8") as f:
        f.write(test.get("stdin", ""))
    sys.stdout.flush()
    sys.stderr.flush()
    start = time.monotonic()
    pid = _fork()
    if pid == 0:
        _in_child(P, test, index, paths)  # never returns
    status, timed_out = _wait(pid, start + time_limit)
    _kill_group(pid, timed_out)
    duration = time.monotonic() - start
    limit = P["max_output_chars"]
    stdout, stdout_cut = _read(out_path, limit)
    stderr, _ = _read(err_path, limit)
    raw, _ = _read(result_path, 1 << 20)
    entry = {"duration_s": round(duration, 3), "stdout": stdout, "stdout_truncated": stdout_cut,
             "stderr": _cut(stderr, P["max_error_chars"])}
    entry.update(_outcome(status, timed_out, raw, time_limit))
    if test["kind"] == "io" and entry["status"] == "passed":
        if stdout_cut or _normalize_output(stdout) != _normalize_output(test.get("stdout", "")):
            entry.update(passed=False, status="wrong_output", error=None)
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass
    # The report must stay small (the sandbox caps output): only a failure carries details.
    if entry.pop("passed") or not P.get("details", True):
        return {"status": entry["status"]}
    if test["kind"] != "io" and entry["status"] != "crashed":
        entry.pop("stdout", None)
        entry.pop("stderr", None)
    return entry


def _in_child(P, test, index, paths):
    """The forked child: its own process group, the test's files as fds 0/1/2, output capped at
    ``max_output_bytes``; then the test itself. Never returns (exit status 70 if the test body does)."""
    stdin_path, out_path, err_path, result_path = paths
    try:
        os.setpgid(0, 0)
        for fd, path, flags in ((0, stdin_path, os.O_RDONLY), (1, out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                (2, err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            src = os.open(path, flags, 0o600)
            os.dup2(src, fd)
            os.close(src)
        try:
            cap = int(P["max_output_bytes"])
            resource.setrlimit(resource.RLIMIT_FSIZE, (cap, cap))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-long write raises instead of killing
        except (ValueError, OSError, AttributeError):
            pass
        _child(P, test, index, result_path)
    finally:
        _exit(70)


def _kill_group(pid, timed_out):
    """Kill the child and anything it started; reap the child if it was still running."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    if timed_out:
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass


def _outcome(status, timed_out, raw, time_limit):
    """``passed``, ``status`` and ``error`` of a test from how its child ended and the result it wrote."""
    if timed_out:
        return {"passed": False, "status": "timeout",
                "error": {"type": "Timeout", "message": "the test did not finish within %gs" % time_limit,
                          "frames": []}}
    try:
        res = _loads(raw) if raw else None
    except ValueError:
        res = None
    if not isinstance(res, dict):
        if os.WIFSIGNALED(status):
            how = "was killed by signal %d" % os.WTERMSIG(status)
            if os.WTERMSIG(status) == signal.SIGKILL:
                how += " (out of memory?)"
        else:
            how = "exited with status %d" % os.WEXITSTATUS(status)
        return {"passed": False, "status": "crashed",
                "error": {"type": "Crash", "message": "the process %s before the test finished" % how, "frames": []}}
    if res.get("ok"):
        return {"passed": True, "status": "passed", "error": None}
    return {"passed": False, "status": "failed", "error": res.get("error")}


def _normalize_output(text):
    """Judge output like most online judges: trailing spaces per line and trailing blank lines ignored."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def grade(P, workdir):
    """All tests of one job (a solution + its tests) under the job's time budget."""
    tests = P["tests"]
    started = time.monotonic()
    budget = float(P["total_time_limit_s"])
    per_test = float(P["test_time_limit_s"])
    report = {"tests": [], "load": None}
    load_failed = None
    if any(t["kind"] == "assert" for t in tests):
        load = _run_test(dict(P, details=True), {"kind": "load"}, -1, workdir, per_test)
        report["load"] = load
        if load["status"] != "passed":
            load_failed = load
    for i, test in enumerate(tests):
        left = budget - (time.monotonic() - started)
        if test["kind"] == "assert" and load_failed is not None:
            entry = {"status": "not_run"}
        elif left <= 0:
            entry = {"status": "budget", "error": {"type": "Timeout", "message": "not run: the attempt's time "
                                                   "budget of %gs was used up" % budget, "frames": []}}
        else:
            entry = _run_test(P, test, i, workdir, min(per_test, left))
        report["tests"].append(entry)
    return report


def main(P):
    """Grade every job of the payload (one per attempt; many when validating a problem set)."""
    if os.path.basename(sys.argv[0]) == "main.py":  # the sandbox's copy of this script holds the tests
        try:
            os.unlink(sys.argv[0])
        except OSError:
            pass
    workdir = tempfile.mkdtemp(prefix="agentgym-")
    reports = []
    for job in P["jobs"]:
        conf = dict(P)
        conf.update(job)
        reports.append(grade(conf, workdir))
    try:
        os.rmdir(workdir)
    except OSError:
        pass
    sys.stdout.write("\n" + REPORT_MARK + _dumps({"jobs": reports}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(_loads(PAYLOAD))  # noqa: F821 - PAYLOAD is prepended by the env
