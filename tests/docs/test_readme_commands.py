"""Every command in README.md, run for real, in the order a newcomer runs them.

The README's ```console blocks (`$ ` lines are commands, the lines after one are
what it prints) and ```sh / ```bash blocks (every line that is not a comment) are
run one after another in one shell session: a fresh bash per command, whose
environment and working directory carry over to the next (`set -a`, so a
variable it sets is kept too). The session's directory is an empty temporary
one holding only links to the repository's `examples/` and `clients/`, so
`./leasehold.db` is a fresh SQLite file there. Code blocks whose first line
names a file (`# myapp/jobs.py`, `// worker.ts`) are written there when the
README reaches them, as a reader pastes them.

Handled specially, and only these:
- `leasehold serve ...` starts in the background on a free port (the test sets
  LEASEHOLD_LISTEN=127.0.0.1:0; the README's serve commands must not pass
  --listen), and the test waits for its `server.started` record. Every later
  command gets LEASEHOLD_SERVER, the variable the README tells readers to set
  for another address. A new serve stops the one before.
- A command ending in `&` runs in the background until the session ends; it
  must not have failed by then.
- `. .venv/bin/activate`: the test's own interpreter's bin directory is first
  on PATH already, and `.venv/bin/X` means that directory's X.
- A quick start line that installs (`python3 -m venv .venv && .venv/bin/pip
  install ...`) is not re-run: what it installs must be what .ci/run installs,
  and the test command it ends with must be the one .ci/run runs.

A command must exit 0. When the README shows output, each line shown must
appear, in order, among the lines the command printed, after normalising what
changes from run to run: job ids (the README's ids are mapped to the real ones
as they are printed, and replaced in later commands), timestamps, durations,
progress bars, the key order of JSON objects and runs of spaces. `…` stands for
anything: alone on a line it skips lines, within a line any text.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import require
from tests.system.helpers import REPO_ROOT, Leasehold, child_env

pytestmark = pytest.mark.slow

README = REPO_ROOT / "README.md"
CI_RUN = REPO_ROOT / ".ci" / "run"
BIN = Path(sys.executable).parent
# What a reader's session may see of the clone: the examples and the clients the
# README runs. Not the repository's own pyproject.toml or tests/, which a pasted
# file or `python -m pytest` there would overwrite or collect.
LINKED = ("examples", "clients")
COMMAND_SECONDS = 300.0

JOB_ID = re.compile(r"job_[0-9a-f]{32}")
FILE_HEADER = re.compile(r"^(?:#|//) ([\w./-]+\.(?:py|toml|ts|mjs|js|json))(?:\s|$)")


# ----- reading the README ------------------------------------------------------------


@dataclass
class Command:
    text: str
    expected: list[str] = field(default_factory=list)
    line: int = 0


@dataclass
class PastedFile:
    path: str
    content: str


Step = Command | PastedFile


def fences(markdown: str) -> Iterator[tuple[str, list[str], int]]:
    """(language, lines, line number of its first line) of every fenced block."""
    lines = markdown.split("\n")
    index = 0
    while index < len(lines):
        opening = re.match(r"^```(\S*)\s*$", lines[index])
        if not opening:
            index += 1
            continue
        start = index + 1
        end = start
        while not lines[end].startswith("```"):
            end += 1
        yield opening.group(1), lines[start:end], start + 1
        index = end + 1


def joined(lines: list[str], first: int) -> Iterator[tuple[str, int]]:
    """Lines with their `\\` continuations joined, each with its line number."""
    pending: list[str] = []
    start = first
    for number, line in enumerate(lines, start=first):
        if not pending:
            start = number
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        yield " ".join([*pending, line]), start
        pending = []
    assert not pending, f"README.md:{start}: a command ends with a continuation"


def steps(markdown: str) -> list[Step]:
    found: list[Step] = []
    for language, lines, first in fences(markdown):
        header = FILE_HEADER.match(lines[0]) if lines else None
        if header and language not in ("console", "sh", "bash", "shell"):
            found.append(PastedFile(header.group(1), "\n".join(lines) + "\n"))
        elif language == "console":
            for text, number in joined(lines, first):
                if text.startswith("$ "):
                    found.append(Command(text[2:], line=number))
                else:
                    assert found and isinstance(found[-1], Command), (
                        f"README.md:{number}: output before any command"
                    )
                    found[-1].expected.append(text)
        elif language in ("sh", "bash", "shell"):
            for text, number in joined(lines, first):
                if text.strip() and not text.lstrip().startswith("#"):
                    found.append(Command(text.strip(), line=number))
    return found


# ----- comparing output --------------------------------------------------------------


def normalised(line: str) -> str:
    line = line.rstrip()
    json_tail = re.search(r"(\{.*\})$", line)
    if json_tail:
        try:
            value = json.loads(json_tail.group(1))
        except json.JSONDecodeError:
            pass
        else:
            compact = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            line = line[: json_tail.start()] + compact
    line = JOB_ID.sub("JOB", line)
    line = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z", "TIME", line)
    line = re.sub(r"\b\d+:\d\d:\d\d\b", "DURATION", line)
    line = re.sub(r"\bin \d+(?:\.\d+)?s\b", "in SECONDSs", line)
    line = re.sub(r"[━╸╺]+[━╸╺ ]*", "BAR ", line)
    return " ".join(line.split())


def shown_lines_appear(expected: list[str], printed: str) -> bool:
    """Every shown line matches a printed line, in order (`…` is a wildcard)."""
    actual = [normalised(line) for line in printed.splitlines()]
    position = 0
    for shown in expected:
        want = normalised(shown)
        if want == "…":
            continue
        pattern = re.compile(".*".join(re.escape(piece) for piece in want.split("…")))
        while position < len(actual) and not pattern.fullmatch(actual[position]):
            position += 1
        if position == len(actual):
            return False
        position += 1
    return True


# ----- the quick start's install lines -----------------------------------------------


def ci_commands() -> tuple[str, str]:
    """(what .ci/run pip-installs, how it runs the tests)."""
    script = CI_RUN.read_text()
    install = re.search(r"^python -m pip install (.+)$", script, re.MULTILINE)
    tests = re.search(r"^(python -m pytest.*)$", script, re.MULTILINE)
    assert install and tests, ".ci/run: no `python -m pip install` or `python -m pytest` line"
    return install.group(1).strip(), tests.group(1).strip()


def check_install_line(command: Command) -> list[str]:
    """The parts of a quick start install line left to run (a serve), after
    checking that it creates .venv, installs what CI installs, and tests as CI does."""
    ci_install, ci_tests = ci_commands()
    ci_spec = shlex.split(ci_install)
    # `pip install .`: the same project CI installs, without -e and its extras.
    plain = [ci_spec[-1].split("[")[0]]
    left: list[str] = []
    for part in (piece.strip() for piece in command.text.split("&&")):
        words = shlex.split(part)
        where = f"README.md:{command.line}: {part!r}"
        if words == ["python3", "-m", "venv", ".venv"]:
            continue
        if words[:2] == [".venv/bin/pip", "install"]:
            assert words[2:] in (ci_spec, plain), f"{where} installs other than .ci/run's {ci_install!r}"
            continue
        if words[:2] == [".venv/bin/python", "-m"] and "pytest" in words:
            assert part.removeprefix(".venv/bin/") == ci_tests, (
                f"{where} is not the test command .ci/run runs ({ci_tests!r})"
            )
            continue
        if words[:2] == [".venv/bin/leasehold", "serve"]:
            left.append(part)
            continue
        raise AssertionError(f"{where}: an install line may only make .venv, pip install, test or serve")
    return left


# ----- the session -------------------------------------------------------------------


class Session:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.cwd = directory
        self.env = child_env({"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"})
        self.env.pop("PYTHONPATH", None)
        self.server: Leasehold | None = None
        self.background: list[tuple[Command, subprocess.Popen[str]]] = []
        self.ids: dict[str, str] = {}
        self.state = directory.parent / "session-state"
        self.state.mkdir()

    # -- pasted files --

    def paste(self, pasted: PastedFile) -> None:
        target = (self.directory / pasted.path).resolve()
        assert target.is_relative_to(self.directory.resolve()), f"{pasted.path} leaves the session"
        assert not any((self.directory / name).resolve() in target.parents for name in LINKED), (
            f"{pasted.path} would be written into the repository"
        )
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(pasted.content)

    # -- commands --

    def run(self, command: Command) -> None:
        died = self.failed_in_background()
        assert not died, "\n".join(died)
        text = command.text
        for shown, real in self.ids.items():
            text = text.replace(shown, real)
        if "pip install" in text:
            for part in check_install_line(command):
                self.serve(part, command)
            return
        if re.fullmatch(r"(?:\.|source) \.venv/bin/activate", text):
            return
        text = text.replace(".venv/bin/", f"{BIN}/")
        words = shlex.split(text)
        assignments = [word for word in words if re.fullmatch(r"[A-Z_]+=.*", word)]
        rest = words[len(assignments) :] if words[: len(assignments)] == assignments else words
        if rest[:1] in (["leasehold"], [f"{BIN}/leasehold"]) and rest[1:2] == ["serve"]:
            self.serve(text, command)
        elif text.endswith("&"):
            self.start_background(text[:-1].strip(), command)
        else:
            self.run_foreground(text, command)

    def serve(self, text: str, command: Command) -> None:
        words = shlex.split(text.replace(".venv/bin/", f"{BIN}/"))
        env = dict(self.env)
        while re.fullmatch(r"[A-Z_]+=.*", words[0]):
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        assert "--listen" not in words, (
            f"README.md:{command.line}: serve with --listen; the test sets the address (LEASEHOLD_LISTEN)"
        )
        env["LEASEHOLD_LISTEN"] = "127.0.0.1:0"
        self.stop_server()
        executable = words[0] if "/" in words[0] else str(BIN / words[0])
        self.server = Leasehold(*words[1:], command=(executable,), env=env, cwd=self.cwd)
        port = self.server.start(timeout=60)
        self.env["LEASEHOLD_SERVER"] = f"127.0.0.1:{port}"

    def script(self, text: str) -> str:
        """Run `text`, then save the environment and directory it leaves for the next command."""
        state = shlex.quote(str(self.state))
        return f"set -a\n{text}\n__status=$?\nenv -0 > {state}/env; pwd > {state}/cwd\nexit $__status\n"

    def run_foreground(self, text: str, command: Command) -> None:
        process = subprocess.Popen(
            ["bash", "-c", self.script(text)],
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        output: list[str] = []
        reader = threading.Thread(target=lambda: output.extend(process.stdout or ()), daemon=True)
        reader.start()
        deadline = time.monotonic() + COMMAND_SECONDS
        # Wait for the command, but not for a job whose background worker died.
        while process.poll() is None:
            died = self.failed_in_background()
            if died or time.monotonic() > deadline:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                reader.join(5)
                why = "\n".join(died) or f"still running after {COMMAND_SECONDS:.0f} s"
                raise AssertionError(f"README.md:{command.line}: `{command.text}`: {why}\n{''.join(output)}")
            try:
                process.wait(0.5)
            except subprocess.TimeoutExpired:
                pass
        reader.join(5)
        finished = subprocess.CompletedProcess(process.args, process.returncode, "".join(output))
        printed = finished.stdout
        assert finished.returncode == 0, (
            f"README.md:{command.line}: `{command.text}` exited {finished.returncode}:\n{printed[-4000:]}"
        )
        self.keep_state()
        self.learn_ids(command, printed)
        assert shown_lines_appear(command.expected, printed), (
            f"README.md:{command.line}: `{command.text}` printed what the README does not show.\n"
            f"README shows:\n" + "\n".join(command.expected) + f"\nprinted:\n{printed[-4000:]}"
        )

    def start_background(self, text: str, command: Command) -> None:
        process = subprocess.Popen(
            ["bash", "-c", text],
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.background.append((command, process))

    def keep_state(self) -> None:
        entries = (self.state / "env").read_text().split("\0")
        env = dict(entry.split("=", 1) for entry in entries if "=" in entry)
        for name in ("_", "SHLVL", "PWD", "OLDPWD", "__status"):
            env.pop(name, None)
        self.env = env
        self.cwd = Path((self.state / "cwd").read_text().strip())

    def learn_ids(self, command: Command, printed: str) -> None:
        """Pair the ids the README shows, in order, with the ids the command printed."""
        shown = [i for i in dict.fromkeys(JOB_ID.findall("\n".join(command.expected))) if i not in self.ids]
        real = [i for i in dict.fromkeys(JOB_ID.findall(printed)) if i not in self.ids.values()]
        assert len(real) >= len(shown), (
            f"README.md:{command.line}: `{command.text}` printed fewer job ids than the README shows"
        )
        self.ids.update(zip(shown, real, strict=False))

    # -- the end --

    def stop_server(self) -> None:
        if self.server is not None and self.server.returncode is None:
            self.server.interrupt()
        self.server = None

    def failed_in_background(self) -> list[str]:
        """The background commands that have exited with a failure (checked before each
        command, so a worker that died is named rather than waited for)."""
        failed = []
        for command, process in self.background:
            if process.poll() is not None and process.returncode != 0:
                output = process.stdout.read() if process.stdout else ""
                where = f"README.md:{command.line}: `{command.text}`"
                failed.append(f"{where} exited {process.returncode} in the background:\n{output[-3000:]}")
        return failed

    def close(self) -> list[str]:
        """Stop everything; the background commands that had failed by then."""
        failed = self.failed_in_background()
        for _, process in self.background:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(5)
        if self.server is not None and self.server.returncode is None:
            self.server.kill()
        return failed


# ----- the tests ---------------------------------------------------------------------


@pytest.mark.timeout(900)
def test_every_readme_command_works_against_a_real_server(tmp_path: Path) -> None:
    require(
        shutil.which("node") is not None and shutil.which("npm") is not None,
        "Node.js and npm (the README's Node worker)",
    )
    directory = tmp_path / "clone"
    directory.mkdir()
    for name in LINKED:
        (directory / name).symlink_to(REPO_ROOT / name, target_is_directory=True)
    session = Session(directory)
    ran = 0
    try:
        for step in steps(README.read_text()):
            if isinstance(step, PastedFile):
                session.paste(step)
            else:
                session.run(step)
                ran += 1
    finally:
        failed = session.close()
    assert not failed, "\n".join(failed)
    assert ran == sum(isinstance(step, Command) for step in steps(README.read_text()))


def test_the_reader_is_walked_through_serve_enqueue_watch_a_handler_its_tests_and_a_node_worker() -> None:
    """What the README must keep showing, so the command test keeps testing it."""
    commands = [step.text for step in steps(README.read_text()) if isinstance(step, Command)]
    wanted = {
        "serve": r"(^|\s)leasehold serve($|\s)",
        "enqueue": r"^leasehold jobs enqueue ",
        "watch": r"^leasehold jobs watch ",
        "the Python client": r"^python examples/python-client/",
        "a handler module": r"leasehold serve --handlers .*myapp\.jobs",
        "its tests": r"^python -m pytest .*myapp",
        "a Node.js worker": r"^LEASEHOLD_KIND=\S+ node clients/node/",
    }
    missing = [name for name, pattern in wanted.items() if not any(re.search(pattern, c) for c in commands)]
    assert not missing, f"README.md no longer runs: {missing}"


def test_the_quick_start_installs_and_tests_as_ci_does() -> None:
    install_lines = [
        step for step in steps(README.read_text()) if isinstance(step, Command) and "pip install" in step.text
    ]
    assert len(install_lines) == 2, [line.text for line in install_lines]
    for line in install_lines:
        check_install_line(line)


def test_the_readme_stays_short() -> None:
    assert len(README.read_bytes()) <= 30_000


@pytest.mark.parametrize(
    ("shown", "printed", "matches"),
    [
        (["enqueued: job_" + "0" * 32], "enqueued: job_" + "1" * 32 + "\n", True),
        (['   3 x {"b":1,"a":"2026-12-06T10:06:07.1Z"}'], '3 x {"a":"2027-01-01T00:00:00Z","b":1}', True),
        (["a", "…", "c"], "a\nb\nc\n", True),
        (["job_" + "0" * 32 + " cancelled …"], "job_" + "1" * 32 + " cancelled ━━╸     4/60 0:00:00", True),
        (["exit status 3"], "exit status 0\n", False),
        (["b", "a"], "a\nb\n", False),
    ],
)
def test_shown_output_is_compared_loosely_but_in_order(shown: list[str], printed: str, matches: bool) -> None:
    assert shown_lines_appear(shown, printed) is matches
