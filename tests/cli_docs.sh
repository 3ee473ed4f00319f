#!/usr/bin/env bash
# Every command in the documentation runs as written. Usage: cli_docs.sh /path/to/l3d
#
# The commands are discovered, not listed: every fenced ```sh / ```bash / ```shell / ```console
# block of README.md, docs/*.md, bench/README.md and examples/**/README*, plus the usage block
# of README's "The CLI" section. A new doc command is therefore checked by default.
#
# Where the commands run: a scratch directory that holds a symlink to every top-level entry
# of the source tree, `build` -> the directory of the l3d under test (so `./build/l3d` and
# `./build/bench/...` are the tested build) and, first on PATH, `l3d` -> the l3d under test
# (so the docs' bare `l3d ...`, also inside `l3d launch -- l3d ...`, is the same program).
# The launcher variables (RANK, OMPI_*, SLURM_*, L3D_*, ...) are removed from the environment.
#
# How each command is checked (the first rule that applies):
# 1. CI: a block that .ci/run holds verbatim (README's test command) is run by CI itself.
# 2. CLUSTER: a command that needs other machines (nodes `a` and `b`, mpirun, Slurm, torchrun
#    across nodes) cannot run here; each `l3d train ...` inside it runs with --dry-run
#    appended (the same checks as the run: flags, files, config, layout) and must exit 0.
#    The rules are the list CLUSTER below, each with its reason.
# 3. Otherwise the command is split at `&&` and each part is
#    - RUN when it starts with l3d, ./build/l3d or ./build/bench/...: run as written, and it
#      must exit 0, or the status a trailing `# exits N` / `# exits N: TEXT` comment in the doc
#      gives (then TEXT must appear in its output). When its output has a markdown table, the
#      first table after the command in the doc must have the same header and the same rows
#      (first column) in the same order: the doc shows what the program prints.
#      A run that does not end in 300 s fails (a hang guard, not a timing assertion).
#    - CHECK-ONLY when it matches the list CHECK_ONLY below (each entry says why it is not
#      run and what is checked instead: the script exists and its --help accepts the flags
#      the doc passes, or CI / the install_consumer test runs the equivalent);
#    - otherwise the test fails, naming the command: classify it (run it, or add it to
#      CHECK_ONLY with the reason).
# Identical commands (./build/l3d and l3d are the same program here) run once.
# 4. The CLI usage block: `l3d --help | --help-env | --version` each exit 0, and every flag
#    listed for a command appears in `l3d COMMAND --help` and is accepted by its flag parser
#    (`l3d COMMAND --help FLAG` must not say "unknown flag" or "unexpected argument").
#
# What runs today (about 50 s of CPU): the main job `./build/l3d train` (README set-up, the
# last command of the main-job line; CI runs the install and build parts), the 3D example
# over `l3d launch` and as threads, `l3d bench comm` on threads and over UCX, bench_gemm,
# bench/zero3_memory.sh (dry runs).
# What is only checked: install-deps/cmake/ctest (CI), cmake --install and the pkg-config
# line (install_consumer), bench/train_step.py, bench/compare_comm.sh and bench/layouts.sh
# (minutes of timed runs), and the multi-node launcher examples of docs/launch.md.
set -u
L3D=$1
here=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3) || { echo "cli_docs: needs python3"; exit 1; }
exec "$PY" - "$L3D" "$(dirname "$here")" <<'EOF'
import glob, os, re, shlex, shutil, signal, subprocess, sys, tempfile, time

L3D = os.path.abspath(sys.argv[1])
SRC = os.path.abspath(sys.argv[2])
BUILD = os.path.dirname(L3D)
CI = open(os.path.join(SRC, ".ci", "run")).read()
INSTALL_TEST = open(os.path.join(SRC, "tests", "install_consumer.cmake")).read()

# Commands that need machines this test does not have. (regex on the command, reason)
CLUSTER = [
    (r"\bmpirun\b.*-H a:", "16 ranks on nodes a and b through Open MPI"),
    (r"#SBATCH|\bsrun\b", "a Slurm allocation of two nodes"),
    (r"\btorchrun\b.*--nnodes 2", "torchrun across two nodes (node_rank 0 of 2)"),
    (r"MASTER_ADDR=a\b", "16 ranks on nodes a and b, the store on a"),
]

fails = passes = 0
def ok(msg, out=""):
    global passes; passes += 1; print("ok   " + msg, flush=True)
def fail(msg, out=""):
    global fails; fails += 1; print("FAIL " + msg, flush=True)
    for l in out.strip().splitlines()[-12:]: print("    " + l)

# ---- extraction ----
def doc_files():
    fs = ["README.md", "bench/README.md"] + sorted(glob.glob("docs/*.md", root_dir=SRC))
    fs += sorted(glob.glob("examples/**/README*", root_dir=SRC, recursive=True))
    return [f for f in fs if os.path.isfile(os.path.join(SRC, f))]

def blocks(lines):
    """(first line number, info word, body lines, index after the block) of each fenced block."""
    i = 0
    while i < len(lines):
        m = re.match(r"\s*(```+|~~~+)\s*([\w+-]*)", lines[i])
        if not m: i += 1; continue
        fence, lang, start, body = m.group(1), m.group(2), i + 1, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i]); i += 1
        yield start + 1, lang, body, i + 1
        i += 1

def split_comment(s):
    """Command text and trailing comment (a # after whitespace, outside quotes)."""
    q = None
    for k, c in enumerate(s):
        if q:
            if c == q: q = None
        elif c in "'\"": q = c
        elif c == "#" and (k == 0 or s[k - 1].isspace()):
            return s[:k].rstrip(), s[k + 1:].strip()
    return s.rstrip(), ""

def split_and(s):
    parts, q, cur, k = [], None, "", 0
    while k < len(s):
        c = s[k]
        if q:
            if c == q: q = None
        elif c in "'\"": q = c
        elif s.startswith("&&", k):
            parts.append(cur.strip()); cur = ""; k += 2; continue
        cur += c; k += 1
    return parts + [cur.strip()]

def commands(lang, body, first):
    """(line, command, comment, whole-script?) of a sh/console block."""
    if lang == "console":
        body = [l[2:] if l.startswith("$ ") else "#" for l in body]
    if body and body[0].startswith("#!"):
        yield first, "\n".join(body), "", True
        return
    cur, start, depth = "", None, 0
    for n, raw in enumerate(body):
        text, comment = split_comment(raw)
        if not text.strip() and not cur: continue
        if start is None: start = first + n
        cont = text.endswith("\\")
        cur += (text[:-1] if cont else text) + (" " if cont else "\n")
        words = re.findall(r"[\w]+", text)
        depth += sum(w in ("do", "then") for w in words) - sum(w in ("done", "fi") for w in words)
        if cont or depth > 0: continue
        yield start, cur.strip(), comment, "\n" in cur.strip()
        cur, start = "", None

def table_after(lines, idx):
    """Header cells and first-column cells of the first table after line idx, in this section."""
    for i in range(idx, len(lines) - 1):
        if lines[i].startswith("#"): return None
        if lines[i].startswith("|") and re.match(r"\|[\s:|-]+\|\s*$", lines[i + 1]):
            rows, j = [], i + 2
            while j < len(lines) and lines[j].startswith("|"):
                rows.append(cells(lines[j])[0]); j += 1
            return cells(lines[i]), rows
    return None

def cells(row):
    return [c.strip() for c in row.strip().strip("|").split("|")]

def output_table(out):
    ls = out.splitlines()
    for i in range(len(ls) - 1):
        if ls[i].startswith("|") and re.match(r"\|[\s:|-]+\|\s*$", ls[i + 1]):
            rows = [cells(l)[0] for l in ls[i + 2:] if l.startswith("|")]
            return cells(ls[i]), rows
    return None

# ---- the scratch directory ----
scratch = tempfile.mkdtemp(prefix="l3d-docs.")
for e in os.listdir(SRC):
    if e not in (".git", "build") and not os.path.exists(os.path.join(scratch, e)):
        os.symlink(os.path.join(SRC, e), os.path.join(scratch, e))
os.symlink(BUILD, os.path.join(scratch, "build"))
os.mkdir(os.path.join(scratch, ".path"))
os.symlink(L3D, os.path.join(scratch, ".path", "l3d"))
env = {k: v for k, v in os.environ.items()
       if not re.match(r"(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT"
                       r"|OMPI_|SLURM_|PMI_|MPI_LOCAL|L3D_)", k)}
env["PATH"] = os.path.join(scratch, ".path") + ":" + env.get("PATH", "")

def sh(cmd, timeout=300):
    """Run cmd with bash in the scratch directory; a command that does not end in time is
    killed with its whole process group (l3d launch's ranks included)."""
    t0 = time.time()
    p = subprocess.Popen(["bash", "-c", cmd], cwd=scratch, env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out.decode(errors="replace"), time.time() - t0
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return 124, out.decode(errors="replace") + "\n(no end after %d s)" % timeout, timeout

def built_transports():
    _, out, _ = sh("l3d launch -n 1 --transport nosuch -- true")
    m = re.search(r"\(built: ([^)]*)\)", out)
    built = set(re.split(r"[,\s]+", m.group(1)) if m else []) | {"local"}  # launch refuses local
    if not os.path.exists("/dev/nvidiactl"):
        built.discard("nccl")  # (a GPU per rank)
    return built

def cache(name):
    try:
        m = re.search(r"^%s:\w+=(.*)$" % name, open(os.path.join(BUILD, "CMakeCache.txt")).read(), re.M)
        return m.group(1) if m else None
    except OSError:
        return None

# ---- check-only rules: (regex, why not run, check) ----
def check_ci(seg):
    key = " ".join(seg.split()[:4])
    return (None if key in CI else ".ci/run does not run '%s'" % key)

def check_install(seg):
    m = re.search(r"pkg-config ((?:--static )?--cflags --libs llama3d)", seg)
    need = m.group(1) if m else "--install"
    return None if need in INSTALL_TEST else "tests/install_consumer.cmake lacks '%s'" % need

def check_script(seg):
    """The script exists, its --help exits 0 and lists every --flag the doc passes, and the
    paths the doc passes exist here."""
    w = shlex.split(seg)
    interp, script, args = w[0], w[1], w[2:]
    if not os.path.isfile(os.path.join(scratch, script)): return "no file " + script
    rc, out, _ = sh("%s %s --help" % (interp, shlex.quote(script)), timeout=120)
    if rc != 0: return "%s --help exits %d: %s" % (script, rc, out.strip()[-200:])
    for a in args:
        if a.startswith("-"):
            if not re.search(r"(^|[\s\[,])%s\b" % re.escape(a.split("=")[0]), out):
                return "%s --help does not list %s" % (script, a)
        elif not re.fullmatch(r"[\d.]+", a) and not os.path.exists(os.path.join(scratch, a)):
            return "%s: no such path %s" % (script, a)
    return None

def check_llamacpp_script(seg):
    """--help exits 0 and names its argument; without a llama.cpp checkout it says it skipped."""
    script = shlex.split(seg)[1]
    if not os.path.isfile(os.path.join(scratch, script)): return "no file " + script
    rc, out, _ = sh("bash %s --help" % shlex.quote(script), timeout=60)
    if rc != 0 or "LLAMA_CPP_DIR" not in out: return "--help exits %d: %s" % (rc, out.strip()[-200:])
    rc, out, _ = sh("bash %s" % shlex.quote(script), timeout=60)
    if rc != 0 or "skipped" not in out:
        return "without a checkout: exit %d: %s" % (rc, out.strip()[-200:])
    return None

def check_model_dir(seg):
    """A command on a downloaded Hugging Face model directory: every flag it passes is one
    `l3d COMMAND --help FLAG` accepts; the same flow runs on a Llama 3 directory made by the
    tests (tests/reference/test_hf_checkpoint.py, tests/cli_generate.sh)."""
    w = shlex.split(seg)
    for a in w[2:]:
        if a.startswith("--"):
            _, out, _ = sh("l3d %s --help %s" % (w[1], shlex.quote(a)), timeout=60)
            if "unknown flag" in out or "unexpected argument" in out:
                return "l3d %s does not take %s: %s" % (w[1], a, out.strip()[-200:])
    for t in ("tests/reference/test_hf_checkpoint.py", "tests/cli_generate.sh"):
        if not os.path.isfile(os.path.join(SRC, t)): return "no " + t
    return None

CHECK_ONLY = [
    (r"^l3d (train|generate) .*~/(models|runs)/", "needs a model downloaded from the Hugging Face hub "
     "(gigabytes, no network here); checked: each flag is accepted, and the same commands run "
     "on a Llama 3 directory the tests write", check_model_dir),
    (r"bash tools/install-deps\.sh$", "installs Debian packages as root; CI runs it", check_ci),
    (r"cmake -S \. -B build\b", "configures ./build; CI configures and builds the tested tree", check_ci),
    (r"cmake --build build\b", "builds ./build; CI builds the tested tree", check_ci),
    (r"ctest --test-dir build\b", "is the suite this test is part of; CI runs it", check_ci),
    (r"cmake --install build --prefix /opt/", "writes /opt as root; the install_consumer test "
     "installs this build into its tree and builds examples/consumer against it", check_install),
    (r"cc app\.c .*pkg-config (--static )?--cflags --libs llama3d", "app.c is the reader's program; "
     "install_consumer links examples/consumer with the same pkg-config flags", check_install),
    (r"/usr/bin/python3 bench/train_step\.py ", "trains llama3d and torch for minutes; "
     "checked: the script's --help takes the doc's flags", check_script),
    (r"bash bench/(compare_comm|layouts|zero3|precision)\.sh ", "minutes of timed runs on every core "
     "(mpirun, gloo, ucx_perftest, fabtests, 20 layouts, ZeRO-2 against ZeRO-3, float32 "
     "against bf16 and fp16); checked: "
     "--help, the doc's arguments", check_script),
    (r"bash bench/(generate|serve)_vs_llamacpp\.sh ", "needs a llama.cpp checkout built beside us (45 "
     "minutes to build); checked: --help, and its skip line without one", check_llamacpp_script),
]

# ---- the commands ----
seen = {}
def run_command(where, cmd, comment, lines, after):
    m = re.match(r"exits? (\d+)\s*(?::\s*(.+))?$", comment)
    want, text = (int(m.group(1)), m.group(2)) if m else (0, None)
    key = (re.sub(r"(?<![\w/.])(\./)?build/l3d\b", "l3d", cmd), want, text)
    if key in seen:
        (ok if seen[key][0] else fail)("%s: %s (same as %s)" % (where, cmd, seen[key][1]))
        return
    rc, out, dt = sh(cmd)
    good = rc == want and (text is None or text in out)
    msg = "%s: %s (exit %d, %.0f s)" % (where, cmd, rc, dt)
    if good and output_table(out):
        got, doc = output_table(out), table_after(lines, after)
        if doc is None:
            good, msg = False, msg + ": it prints a table and the doc shows none after it"
        elif got[0] != doc[0]:
            good, msg = False, msg + ": the doc's table header %s is not the output's %s" % (doc[0], got[0])
        elif got[1] != doc[1]:
            good, msg = False, msg + ": the doc's rows %s are not the output's %s" % (doc[1], got[1])
        else:
            msg += ", the doc's table has its header and rows"
    seen[key] = (good, where)
    if good: ok(msg)
    elif rc != want: fail(msg + " (the doc expects exit %d)" % want, out)
    elif text is not None and text not in out: fail(msg + ": its output lacks '%s'" % text, out)
    else: fail(msg, out)

def check_command(where, cmd, comment, lines, after):
    for pat, why in CLUSTER:
        if re.search(pat, cmd):
            inner = re.findall(r"(?<![\w/.-])l3d\s+train\b[^&|;\n]*", cmd)
            if not inner: ok("%s: skipped, needs %s" % (where, why))
            for c in inner:
                c = c.strip()
                rc, out, _ = sh(c + " --dry-run", timeout=120)
                (ok if rc == 0 else fail)("%s: not run (needs %s); '%s --dry-run' exits %d"
                                          % (where, why, c, rc), out)
            return
    for seg in split_and(cmd):
        # CHECK_ONLY first: some l3d commands need what this machine lacks (a downloaded model).
        hit = next(((p, w, c) for p, w, c in CHECK_ONLY if re.match(p, seg)), None)
        # (bench scripts of dry runs only take seconds: they run like the programs)
        if hit is None and re.match(r"(\./)?(build/l3d|l3d|build/bench/)\b|bash bench/zero3_memory\.sh ",
                                    seg):
            # What a build may leave out (cmake options, transports not found) is skipped,
            # saying so; everything else runs.
            t = re.search(r"--transport[ =](\w+)", seg)
            if re.match(r"(\./)?build/bench/", seg) and cache("L3D_BUILD_BENCH") == "OFF":
                ok("%s: skipped, this build has no benchmarks (L3D_BUILD_BENCH=OFF): %s" % (where, seg))
            elif t and t.group(1) not in TRANSPORTS:
                ok("%s: skipped, this build or machine lacks the %s transport: %s"
                   % (where, t.group(1), seg))
            else:
                run_command(where, seg, comment, lines, after)
            continue
        if hit:
            pat, why, check = hit
            err = check(seg)
            if err: fail("%s: %s: %s" % (where, seg, err))
            else: ok("%s: checked, not run (%s): %s" % (where, why, seg))
        else:
            fail("%s: a doc command this test does not know: %s (run it, or add it to "
                 "CHECK_ONLY in tests/cli_docs.sh with the reason)" % (where, seg))

def check_usage_block(body, where):
    entries, cur = [], None
    for l in body:
        if l.startswith("l3d "): cur = [l]; entries.append(cur)
        elif cur is not None and l.strip(): cur.append(l)
    helps = {}
    for e in entries:
        text = " ".join(re.sub(r"\s{2,}\(.*\)\s*$", "", l) for l in e)  # drop the remarks
        words = text.split()[1:]
        if words[0].startswith("-"):  # l3d --help | --help-env | --version
            for f in [w for w in words if w.startswith("-")]:
                rc, out, _ = sh("l3d " + f)
                (ok if rc == 0 else fail)("%s: l3d %s exits %d" % (where, f, rc), out)
            continue
        cmd = []
        for w in words:
            if w.startswith("-") or w.startswith("[") or not re.fullmatch(r"[a-z]+", w): break
            cmd.append(w)
        cmd = " ".join(cmd)
        flags = re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", text.split(" -- ")[0])
        rc, helptext, _ = sh("l3d %s --help" % cmd)
        if rc != 0:
            fail("%s: l3d %s --help exits %d" % (where, cmd, rc), helptext); continue
        for f in dict.fromkeys(flags):
            listed = re.search(r"^\s+%s(\s|,|$)" % re.escape(f), helptext, re.M)
            rc, out, _ = sh("l3d %s --help %s" % (cmd, f))
            rejected = re.search(r"unknown flag|unexpected argument", out)
            if listed and not rejected: ok("%s: l3d %s takes %s" % (where, cmd, f))
            else: fail("%s: l3d %s %s: %s" % (where, cmd, f,
                       "rejected by its parser" if rejected else "not in its --help"), out)

def main():
    for f in doc_files():
        lines = open(os.path.join(SRC, f)).read().splitlines()
        section, heads = "", {}
        for n, l in enumerate(lines):
            if l.startswith("#"): section = l.lstrip("#").strip()
            heads[n + 1] = section
        for first, lang, body, after in blocks(lines):
            if f == "README.md" and heads[first] == "The CLI" and lang == "":
                check_usage_block(body, "%s:%d" % (f, first))
                continue
            if lang not in ("sh", "bash", "shell", "console"): continue
            whole = "\n".join(body).strip()
            if whole and whole in CI:
                ok("%s:%d: run by CI verbatim (.ci/run): %s" % (f, first, whole))
                continue
            for line, cmd, comment, _ in commands(lang, body, first):
                check_command("%s:%d" % (f, line), cmd, comment, lines, after)

try:
    TRANSPORTS = built_transports()
    main()
finally:
    shutil.rmtree(scratch, ignore_errors=True)
print("%d passed, %d failed" % (passes, fails))
sys.exit(1 if fails else 0)
EOF
