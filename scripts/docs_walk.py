"""The walk: every shell command of README.md and docs/*.md, run in page order, as written, in one
fresh copy of the checkout; prints one line per command and a JSON summary.

    python scripts/docs_walk.py [--quick] [--jobs N] [--pages README.md,docs/data.md] [--keep DIR]
                                [--json F]

Page order is the reader's: README.md, then the pages in the order of the README's
"Documentation" list (`PAGE_ORDER`); a page under docs/ missing from that list is an error.

Where the commands run: a copy of the checkout's files (tracked and untracked, not ignored) made
into a fresh git repository, with `.venv` linked to the environment `make` built and that
environment first on PATH, as `source .venv/bin/activate` leaves a shell (the README's "Quick
start"); PYTHONPATH names the copy, as the editable install names the checkout it was made from;
HOME is a fresh folder inside the copy's ignored `runs/`, so nothing is read from or written to the
walker's home (`~/.cache/hybrid-dlrm`); the copy's requirements.txt and pyproject.toml are dated
before the environment's stamp, so `make run` uses that environment and rebuilds nothing.

A command is one line of a ```bash block (`\\` continuations and a heredoc's body are part of it;
a line that is only a `# comment` is prose). Its expected exit code is 0, or N where the line
ends in a comment `# exits N` (a command shown failing on purpose). Not run, and counted as
skipped with the reason:
  - every command of a block preceded by `<!-- walk: skip REASON -->` (a GPU, several machines,
    a data set that must be downloaded), or only those starting with PREFIX where the comment is
    `<!-- walk: skip `PREFIX`: REASON -->` (several such comments may precede a block);
  - a template: a command with a placeholder in capitals (`RAW/train.txt`, `--model ART`,
    `HOST:29500`), an elision (`...`) or an optional part in brackets (`[--mlperf]`).
Pages run one after another, or with `--jobs 2` two at a time (the suite's walk: most of a
command's time is one core importing torch, so two pages on two cores take about half as long;
OMP_NUM_THREADS=1 then, a core per page), each page's commands still in order, and a page in page order only once every page it names in
`<!-- walk: after PAGE, PAGE: WHY -->` (a line of its own: the pages whose outputs it reads,
as docs/data.md reads README.md's samples) has ended. A page that reads another's outputs without
saying so fails when run beside it, as it would for a reader who skipped that page.

With `--quick`, HYBRID_DLRM_QUICK=1 shortens what the commands do (hybrid_dlrm/common/quick.py),
never the commands. At the end the copy must be clean outside its ignored folders (`git status
--porcelain` empty): every output a page names lands where .gitignore expects it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^\s*(```|~~~)\s*(\S*)")
SKIP = re.compile(r"^\s*<!--\s*walk:\s*skip\s+(.+?)\s*-->\s*$")  # a line of its own
AFTER = re.compile(r"^\s*<!--\s*walk:\s*after\s+(.+?)\s*-->\s*$")
EXITS = re.compile(r"#\s*exits\s+(\d+)\b")
# a placeholder: a word in capitals used as a path or a value (RAW/day, ART, HOST:29500, RAW_DIR)
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]+(?:[/:].*)?$")
QUICK_ENV = "HYBRID_DLRM_QUICK"


def page_order(root: Path = ROOT) -> list[str]:
    """README.md, then every page the README's Documentation list links to, in its order."""
    text = (root / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Documentation", 1)[1].split("\n## ", 1)[0]
    pages = ["README.md"]
    for target in re.findall(r"^- \[[^\]]*\]\((docs/[\w-]+\.md)\)", section, re.M):
        if target not in pages:
            pages.append(target)
    return pages


def needs(page: str, root: Path = ROOT) -> list[str]:
    """The pages `page` says it runs after (`<!-- walk: after PAGE, PAGE: WHY -->`)."""
    out: list[str] = []
    for line in (root / page).read_text(encoding="utf-8").splitlines():
        m = AFTER.match(line)
        if m:
            out += [x.strip() for x in m.group(1).split(":")[0].split(",") if x.strip()]
    return out


@dataclass
class Command:
    page: str
    line: int  # the page's line of the command's first line
    text: str  # as written, continuations and heredoc included
    expect: int = 0
    skip: str | None = None  # why it is not run
    status: str = ""  # ok, failed, skipped
    rc: int | None = None
    seconds: float | None = None
    tail: list[str] = field(default_factory=list)  # the last lines of stderr (and stdout)
    silent_s: float | None = None  # the longest time without a line of output
    output: str = ""  # stdout and stderr, each line with its time, to compare with the page

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0]


def _template(text: str) -> str | None:
    """Why `text` is a template rather than a command, or None."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        words = text.split()
    for word in words:
        value = word.split("=", 1)[1] if word.startswith("--") and "=" in word else word
        if value == "..." or value.startswith("["):
            return f"template: {value!r} is left for the reader to fill in"
        if PLACEHOLDER.match(value) and "=" not in word:
            return f"template: {value.split('/')[0].split(':')[0]} is a placeholder"
    return None


def commands(page: str, root: Path = ROOT) -> list[Command]:
    """Every command of the page's bash blocks, in order."""
    out: list[Command] = []
    lines = (root / page).read_text(encoding="utf-8").splitlines()
    fenced, lang, held, start, heredoc = False, "", [], 0, None
    skips: list[tuple[str, str]] = []  # (command prefix or "", reason) since the last block
    block_skips: list[tuple[str, str]] = []
    for n, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if m and heredoc is None:
            if not fenced:
                fenced, lang, block_skips, skips = True, m.group(2), skips, []
            else:
                fenced = False
            continue
        if not fenced:
            s = SKIP.match(line)
            if s:
                p = re.match(r"`([^`]+)`:\s*(.+)", s.group(1))
                skips.append((p.group(1), p.group(2)) if p else ("", s.group(1)))
            continue
        if lang != "bash":
            continue
        if heredoc is not None:
            held.append(line)
            if line.strip() == heredoc:
                heredoc = None
                out.append(_command(page, start, held, block_skips))
                held = []
            continue
        if not held and (not line.strip() or line.lstrip().startswith("#")):
            continue  # prose inside the block
        if not held:
            start = n
        held.append(line)
        h = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if h:
            heredoc = h.group(1)
            continue
        if line.rstrip().endswith("\\"):
            continue
        out.append(_command(page, start, held, block_skips))
        held = []
    return out


def _command(page: str, line: int, held: list[str], skips: list[tuple[str, str]]) -> Command:
    text = "\n".join(held)
    e = EXITS.search(held[-1])
    cmd = Command(page, line, text, expect=int(e.group(1)) if e else 0)
    skip = next((why for prefix, why in skips if text.startswith(prefix)), None)
    heredoc = len(held) > 1 and "<<" in held[0]  # its body is no shell words
    shell = re.sub(r"<<-?\s*['\"]?\w+['\"]?", "", held[0]) if heredoc else text
    cmd.skip = skip or _template(shell)
    return cmd


def environment_root() -> Path:
    """The environment `make` built: the checkout's .venv, or the one running this script."""
    if (ROOT / ".venv" / "bin" / "python").exists():
        return ROOT / ".venv"
    if sys.prefix != sys.base_prefix:
        return Path(sys.prefix)
    raise SystemExit("docs_walk.py: error: no .venv in the checkout and no virtual environment "
                     "running this script; run `make` first")  # fmt: skip


def fresh_checkout(where: Path) -> Path:
    """A copy of the checkout's files as a fresh git repository (one commit), `.venv` linked."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    copy = where / "checkout"
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():  # a file deleted in the work tree is still listed
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, copy / name)
    # the compiled code the checkout already has (numba's kernels, Python's bytecode; ignored by
    # git): each kernel's first compile is paid where the code was run first, as a reader's own
    # `make run` pays it once, not again by the walk's first command of each kind
    for cache in {(ROOT / name).parent / "__pycache__" for name in filter(None, files)}:
        if cache.is_dir() and (copy / cache.relative_to(ROOT)).parent.is_dir():
            shutil.copytree(cache, copy / cache.relative_to(ROOT), dirs_exist_ok=True)
    git = ["git", "-c", "user.name=walk", "-c", "user.email=walk@localhost"]
    subprocess.run(["git", "init", "-q"], cwd=copy, check=True)
    subprocess.run([*git, "add", "-A"], cwd=copy, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "walk"], cwd=copy, check=True)
    venv = environment_root()
    (copy / ".venv").symlink_to(venv, target_is_directory=True)
    with open(
        copy / ".git" / "info" / "exclude", "a"
    ) as f:  # a link: `.venv/` ignores folders only
        f.write("/.venv\n")
    stamp = venv / ".installed"
    if stamp.exists():  # make's rule: the environment is newer than what it was built from
        then = stamp.stat().st_mtime - 60
        for name in ("requirements.txt", "pyproject.toml"):
            os.utime(copy / name, (then, then))
    return copy


def walk_env(copy: Path, quick: bool, jobs: int = 1) -> dict[str, str]:
    # a user's shell: none of the walker's own settings (a test's HYBRID_DLRM_CACHE, a sandbox's
    # PYTHONDONTWRITEBYTECODE, which would make every command compile the checkout again, and
    # PYTHONUNBUFFERED, which would hide a line printed without a flush)
    drop = (
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONHOME",
        "PYTHONUNBUFFERED",
    )
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("HYBRID_DLRM_") and k not in drop
    }
    home = copy / "runs" / ".walk-home"
    home.mkdir(parents=True, exist_ok=True)
    env.update(HOME=str(home), PYTHONPATH=str(copy), VIRTUAL_ENV=str(copy / ".venv"),
               PATH=f"{copy / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}")  # fmt: skip
    if quick:
        env[QUICK_ENV] = "1"
    if jobs > 1:
        # a core per page, as a user running two things at once would say: an OpenMP team of
        # two beside the other page's command waits on its descheduled thread at every op
        # (quantize's precision search, 0.05 s a table alone, took 2 s)
        env["OMP_NUM_THREADS"] = "1"
    return env


_RUNNING: set[subprocess.Popen] = set()  # the commands running now, on any page's thread
_RUNNING_LOCK = threading.Lock()


def _stop_running() -> None:
    """Every running command's process group ended: a walk stopped by Ctrl-C or an error while
    pages run on worker threads leaves nothing running."""
    with _RUNNING_LOCK:
        procs = list(_RUNNING)
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run(cmd: Command, copy: Path, env: dict[str, str], timeout: float) -> None:
    """Run one command; its output lines are timed, so a long silence shows (`silent_s`: the
    longest wait for a line, from the start to the end)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(["bash", "-c", cmd.text], cwd=copy, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)  # fmt: skip
    with _RUNNING_LOCK:
        _RUNNING.add(proc)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(
        target=lambda: lines.extend((time.perf_counter() - t0, x) for x in proc.stdout), daemon=True
    )  # list.extend of a generator appends as it goes: a line is seen when printed
    reader.start()
    try:
        cmd.rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        cmd.rc = None
    finally:  # timed out, or the walk itself stopped (Ctrl-C): no command left running
        if proc.poll() is None or cmd.rc is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its whole process group, not only bash
            except ProcessLookupError:
                pass
            proc.wait()
        with _RUNNING_LOCK:
            _RUNNING.discard(proc)
    reader.join(timeout=10)
    cmd.seconds = round(time.perf_counter() - t0, 2)
    said = [x for _, x in lines]
    times = [0.0, *(t for t, _ in lines), cmd.seconds]
    cmd.silent_s = round(max(b - a for a, b in zip(times, times[1:])), 1)
    cmd.output = "".join(f"[{t:6.1f}s] {x}" for t, x in lines)
    cmd.tail = "".join(said).strip().splitlines()[-8:]
    if cmd.rc is None:
        cmd.tail.append(f"timed out after {timeout:.0f} s")
    cmd.status = "ok" if cmd.rc == cmd.expect else "failed"


def schedule(pages: list[str], after: dict[str, list[str]], jobs: int, walk_page) -> None:
    """`walk_page(page)` for every page, `jobs` at a time: each free worker takes the first page
    in page order whose `after` pages (those among `pages`) have all ended."""
    unknown = sorted({(p, a) for p in pages for a in after.get(p, []) if a not in pages})
    for p, a in unknown:
        if a not in page_order():
            raise ValueError(f"{p}: <!-- walk: after {a} -->: no such page in the walk's order")
    waiting, done, errors, busy = list(pages), set(), [], [0]
    cond = threading.Condition()

    def ready() -> str | None:
        return next((p for p in waiting
                     if all(a in done or a not in pages for a in after.get(p, []))), None)  # fmt: skip

    def worker() -> None:
        while True:
            with cond:
                while waiting and (page := ready()) is None and not errors:
                    if not busy[0]:  # nothing runs that could free a page: a cycle
                        errors.append(ValueError(f"<!-- walk: after -->: {', '.join(waiting)} "
                                                 "wait for each other"))  # fmt: skip
                        cond.notify_all()
                        return
                    cond.wait()
                if not waiting or errors:
                    return
                waiting.remove(page)
                busy[0] += 1
            try:
                walk_page(page)
            except BaseException as e:  # noqa: BLE001 - handed to the caller below
                errors.append(e)
            with cond:
                done.add(page)
                busy[0] -= 1
                cond.notify_all()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def walk(pages: list[str], workdir: Path, *, quick: bool, timeout: float, echo=None,
         jobs: int = 1) -> dict:  # fmt: skip
    """Run every command of `pages` in one fresh copy under `workdir`, `jobs` pages at a time
    (`schedule`); the walk's record, in page order."""
    copy = fresh_checkout(workdir)
    env = walk_env(copy, quick, jobs)
    by_page: dict[str, list[Command]] = {}
    logs = workdir / "logs"  # what each command printed, to compare with its page
    logs.mkdir()
    said = threading.Lock()

    stopping = threading.Event()

    def walk_page(page: str) -> None:
        done = by_page[page] = []
        for cmd in commands(page):
            if stopping.is_set():
                return
            if cmd.skip:
                cmd.status = "skipped"
            else:
                run(cmd, copy, env, timeout)
                name = f"{pages.index(page):02d}-{page.replace('/', '-')}-{cmd.line:04d}.log"
                (logs / name).write_text(f"$ {cmd.text}\n{cmd.output}", encoding="utf-8")
            done.append(cmd)
            if echo:
                with said:
                    echo(cmd)

    try:
        schedule(pages, {p: needs(p) for p in pages}, jobs, walk_page)
    except BaseException:
        stopping.set()
        _stop_running()
        raise
    record = [cmd for page in pages for cmd in by_page[page]]
    left = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=copy,
                          capture_output=True, text=True, check=True).stdout.splitlines()  # fmt: skip
    counts = {s: sum(c.status == s for c in record) for s in ("ok", "failed", "skipped")}
    return {"quick": quick, "jobs": jobs, "copy": str(copy), "counts": counts, "left_in_checkout": left,
            "commands": [asdict(c) for c in record]}  # fmt: skip


def _echo(cmd: Command) -> None:
    where = f"{cmd.page}:{cmd.line}"
    if cmd.status == "skipped":
        print(f"skip    {where}  {cmd.first_line}  ({cmd.skip})", flush=True)
        return
    print(f"{cmd.status:7} {where}  {cmd.seconds:7.1f} s (silent {cmd.silent_s:5.1f} s)  "
          f"exit {cmd.rc}  {cmd.first_line}", flush=True)  # fmt: skip
    if cmd.status == "failed":
        for line in cmd.tail:
            print(f"          | {line}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="docs_walk.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help=f"set {QUICK_ENV}=1 for every command")
    p.add_argument("--pages", help="a comma-separated subset of the pages, in page order")
    p.add_argument("--keep", type=Path, help="walk in this (new) folder and keep it")
    p.add_argument("--json", type=Path, help="write the walk's record here")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per command")
    p.add_argument("--jobs", type=int, default=1, help="pages run at a time (default 1)")
    args = p.parse_args(argv)
    order = page_order()
    pages = order if not args.pages else [x for x in order if x in args.pages.split(",")]
    if args.keep:
        if args.keep.exists():
            p.error(f"--keep {args.keep}: exists; name a new folder")
        args.keep.mkdir(parents=True)
        result = walk(pages, args.keep.resolve(), quick=args.quick, timeout=args.timeout,
                      echo=_echo, jobs=args.jobs)  # fmt: skip
    else:
        with tempfile.TemporaryDirectory(prefix="docs-walk-") as tmp:
            result = walk(
                pages, Path(tmp), quick=args.quick, timeout=args.timeout, echo=_echo, jobs=args.jobs
            )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"counts": result["counts"], "left_in_checkout": result["left_in_checkout"]}))
    return 0 if not result["counts"]["failed"] and not result["left_in_checkout"] else 1


if __name__ == "__main__":
    sys.exit(main())
