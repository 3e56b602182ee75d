"""The shell commands in the README and the docs site, checked against the tree.

Two kinds of fenced block (docs/index.md, "Commands on these pages", tells the reader):

- ```bash: runnable as pasted, from the repository's root (after `make serve`, or with the
  service or Docker the text around it names). Every file a command names must be in the
  repository, or be written by a command before it in the same block.
- ```sh: illustrative (placeholders, your own data, another machine's paths). Its files are
  not checked.

In both, every `make` target must be one the Makefile has, every `python -m` module one the
repository (or the venv) has, with a subcommand and options its parser takes, every script a
file, and every `docker compose` file and service one the compose files have.

Fast tier: no TensorFlow. `python -m training`'s parser imports it, so its subcommands and
options are read from the source (the `add_parser` and `add_argument` calls) instead.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import re
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
         ROOT / "deploy" / "kubernetes" / "README.md", ROOT / "models" / "README.md"]  # fmt: skip
SHELLS = ("sh", "bash")
RUNNABLE = "bash"
SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;", "|&"}
PYTHONS = re.compile(r"^(python3?(\.\d+)?|\.venv(-training)?/bin/python3?|\$\(PY\))$")
# `docker compose run`'s options that take a value (the service's name comes after them).
COMPOSE_RUN_VALUES = {"-p", "--publish", "-e", "--env", "-v", "--volume", "-w", "--workdir",
                      "--entrypoint", "--name", "-u", "--user", "-l", "--label"}  # fmt: skip
# What a runnable block may use before it exists: the files a command writes, by command.
WRITTEN_BY = {
    ("make", "tokens"): [
        "secrets/api-tokens",
        "secrets/api-tokens.issued",
        "secrets/api-tokens.prometheus",
    ],
    ("make", "shipped-model"): ["models/fashion_mnist/1"],
}


@dataclasses.dataclass(frozen=True)
class Block:
    path: Path
    line: int
    language: str
    text: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def fenced_blocks(path: Path) -> list[Block]:
    """Every fenced code block of a Markdown file (indented fences too, as in lists)."""
    blocks, language, start, lines, indent = [], None, 0, [], 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.lstrip()
        if language is None:
            if stripped.startswith("```"):
                language, start, lines = stripped[3:].strip(), number, []
                indent = len(line) - len(stripped)
        elif stripped == "```":
            blocks.append(Block(path, start, language, "\n".join(lines)))
            language = None
        else:
            lines.append(line[indent:])
    return blocks


def commands(text: str) -> list[list[str]]:
    """The block's commands as words: continuation lines joined, comments dropped, split at
    `&&`, `|`, `;` and the parentheses of `$(...)`; leading assignments and `export` left out."""
    text = re.sub(r"\\\n", " ", text)
    found, pending = [], ""
    for line in text.splitlines():
        # A quoted string may go on over the next lines.
        pending = f"{pending}\n{line}" if pending else line
        lexer = shlex.shlex(pending, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            tokens = list(lexer)
        except ValueError:
            continue
        pending = ""
        words: list[str] = []
        for token in [*tokens, ";"]:
            if token in SEPARATORS:
                while words and (words[0] == "export" or re.match(r"^\w+=", words[0])):
                    words.pop(0)
                if words:
                    found.append(words)
                words = []
            else:
                words.append(token)
    return found


@functools.cache
def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    targets = set()
    for match in re.finditer(r"^([A-Za-z][\w.-]*(?: [A-Za-z][\w.-]*)*)\s*:(?!=)", text, re.M):
        targets.update(match[1].split())
    return targets


def module_path(module: str) -> Path | None:
    """The repository's file or package for a dotted module name, else None."""
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base / "__main__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def literal_calls(paths: list[Path], method: str) -> list[tuple[str, ...]]:
    """The string-literal positional arguments of every `.method(...)` call in these files."""
    calls = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == method):  # fmt: skip
                strings = tuple(a.value for a in node.args
                                if isinstance(a, ast.Constant) and isinstance(a.value, str))  # fmt: skip
                if strings:
                    calls.append(strings)
    return calls


def project_sources(package: Path) -> list[Path]:
    """The package's own .py files: not those of a venv or cache in a hidden folder under it
    (`make bench-peers` installs the peers' venvs in `benchmarks/.peers/`, 20,000 files)."""
    return [
        path
        for path in package.rglob("*.py")
        if not any(part.startswith(".") for part in path.relative_to(package).parts)
    ]


@functools.cache
def parser_words(module: str) -> tuple[set[str], set[str]]:
    """(subcommands, options) a repository module's command line takes, from its source:
    `add_parser` in the module's own file, `add_argument` anywhere in its top-level package."""
    if module == "service":
        from service.cli import build_parser

        options = {o for a in build_parser()._actions for o in a.option_strings}
        return set(), options
    main = module_path(module)
    package = ROOT / module.split(".")[0]
    sources = sorted(project_sources(package)) if package.is_dir() else [main]
    subcommands = {call[0] for call in literal_calls([main], "add_parser")}
    options = {word for call in literal_calls(sources, "add_argument") for word in call
               if word.startswith("-")}  # fmt: skip
    return subcommands, options | {"-h", "--help"}


def problems(block: Block) -> list[str]:
    """What in the block does not match the tree."""
    found = []
    targets = makefile_targets()
    written: set[str] = set()
    for words in commands(block.text):
        program, args = words[0], words[1:]
        if program == "make":
            for target in (a for a in args if not a.startswith("-") and "=" not in a):
                if target not in targets:
                    found.append(f"make {target}: no such target in the Makefile")
                written.update(WRITTEN_BY.get(("make", target), []))
        elif PYTHONS.match(program) and args:
            found += python_problems(args)
        elif program == "docker" and args[:1] == ["compose"]:
            found += compose_problems(args[1:])
        if block.language == RUNNABLE:
            for path in repository_paths(words):
                if not (ROOT / path).exists() and path.rstrip("/") not in written:
                    found.append(f"{path}: no such file, and no command before it writes it")
    return found


def python_problems(args: list[str]) -> list[str]:
    if args[0] != "-m":
        script = args[0]
        ok = script.startswith("-") or (ROOT / script).is_file()
        return [] if ok else [f"python {script}: no such script"]
    module, rest = args[1], args[2:]
    if module_path(module) is None:
        if importlib.util.find_spec(module.split(".")[0]) is not None:
            return []  # a tool of the venv (pytest, mkdocs...)
        return [f"python -m {module}: no such module in the repository or the venv"]
    subcommands, options = parser_words(module)
    found = []
    positional = [a for a in rest if not a.startswith("-")]
    if subcommands and positional and positional[0] not in subcommands:
        found.append(f"python -m {module} {positional[0]}: not one of {sorted(subcommands)}")
    for option in (a.split("=")[0] for a in rest if a.startswith("--")):
        if option not in options:
            found.append(f"python -m {module}: no option {option}")
    return found


def compose_services(files: list[str]) -> set[str]:
    services = set()
    for name in files:
        services.update(yaml.safe_load((ROOT / name).read_text()).get("services", {}))
    return services


def compose_problems(args: list[str]) -> list[str]:
    files = [args[i + 1] for i, a in enumerate(args) if a == "-f"] or ["docker-compose.yml"]
    missing = [f for f in files if not (ROOT / f).is_file()]
    if missing:
        return [f"docker compose -f {f}: no such file" for f in missing]
    if "run" in args:
        rest, words = iter(args[args.index("run") + 1 :]), []
        for word in rest:
            if word in COMPOSE_RUN_VALUES:
                next(rest, None)
            elif not word.startswith("-"):
                words.append(word)
        if words and words[0] not in compose_services(files):
            return [f"docker compose run {words[0]}: no such service in {', '.join(files)}"]
    return []


def repository_paths(words: list[str]) -> list[str]:
    """The words that name a path in the repository (a top-level entry's name, then /...):
    `@file` and `name=@file` (curl), `--option=path` included."""
    tops = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")} | {"secrets", "runs"}
    candidates = words[1:]
    if words[0] == "kubectl":
        # Its other words are the cluster's (service/api is a Service, not a folder).
        candidates = [
            w for before, w in zip(words, words[1:], strict=False) if before in ("-f", "-k")
        ]
        candidates += [w for w in words if w.startswith("--from-file=")]
    paths = []
    for word in candidates:
        word = re.sub(r"^(?:--[\w-]+=|\w+=)*@?", "", word)
        top = word.split("/")[0]
        if "/" in word and top in tops and not word.startswith("/"):
            paths.append(word)
    return paths


def shell_blocks() -> list[Block]:
    return [b for page in PAGES for b in fenced_blocks(page) if b.language in SHELLS]


# ---- the reader -------------------------------------------------------------------------------


def test_the_reader_splits_commands_and_drops_comments_and_assignments():
    text = (
        "make tokens   # once\n"
        "export APP_UID=$(id -u)\n"
        'TOKEN=$(awk \'/ predict/ {print $1}\' secrets/x.issued)\n'
        "curl -s -H \"Authorization: Bearer $TOKEN\" localhost:8000/v1 -d @examples/predict.json"
        " \\\n  && MODEL_NAME=x python -m service --port=1 | tail\n"
    )  # fmt: skip
    assert commands(text) == [
        ["make", "tokens"],
        ["id", "-u"],
        ["awk", "/ predict/ {print $1}", "secrets/x.issued"],
        ["curl", "-s", "-H", "Authorization: Bearer $TOKEN", "localhost:8000/v1", "-d",
         "@examples/predict.json"],
        ["python", "-m", "service", "--port=1"],
        ["tail"],
    ]  # fmt: skip


def test_the_reader_finds_fenced_blocks_indented_ones_included(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# x\n\n```bash\nmake serve\n```\n\n1. step\n\n   ```sh\n   make x\n   ```\n")
    assert [(b.language, b.text) for b in fenced_blocks(page)] == [
        ("bash", "make serve"),
        ("sh", "make x"),
    ]


@pytest.mark.parametrize(
    "language, text, expected",
    [
        pytest.param("sh", "make no-such-target", "make no-such-target: no such target",
                     id="make-target"),
        pytest.param("sh", "python -m training trian --epochs 1", "training trian: not one of",
                     id="subcommand"),
        pytest.param("sh", "python -m training train --epoch 1", "no option --epoch",
                     id="option"),
        pytest.param("sh", "python -m no_such_module", "no such module", id="module"),
        pytest.param("sh", "python tools/no_such_script.py", "no such script", id="script"),
        pytest.param("sh", "python -m service --rest-api-port=1", "no option --rest-api-port",
                     id="service-flag"),
        pytest.param("sh", "docker compose --profile train run --rm trainr", "no such service",
                     id="compose-service"),
        pytest.param("sh", "docker compose -f docker-compose.nope.yml up -d", "no such file",
                     id="compose-file"),
        pytest.param("bash", "curl -d @examples/nope.json localhost:8000", "examples/nope.json",
                     id="missing-file"),
        pytest.param("bash", "cat secrets/api-tokens.issued", "secrets/api-tokens.issued",
                     id="not-written-yet"),
        pytest.param("bash", "kubectl create secret generic x --from-file=tokens=secrets/x",
                     "secrets/x", id="option-and-key"),
        pytest.param("bash", "kubectl apply -k deploy/kubernetes/nope", "kubernetes/nope",
                     id="kustomization"),
    ],
)  # fmt: skip
def test_a_command_that_does_not_match_the_tree_is_found(language, text, expected):
    found = problems(Block(ROOT / "README.md", 1, language, text))
    assert len(found) == 1 and expected in found[0], found


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("make tokens\nawk '{print $1}' secrets/api-tokens.issued", id="written"),
        pytest.param("python -m training train --epochs 1 --model cnn", id="training"),
        pytest.param("python -m service --rest_api_port=8501 --help", id="service"),
        pytest.param("python -m pytest tests/unit", id="venv-tool"),
        pytest.param("docker compose --profile train run --rm trainer", id="compose"),
        pytest.param("kubectl -n x port-forward service/api 8000:8000", id="kubectl-resource"),
    ],
)
def test_commands_that_match_the_tree_pass(text):
    assert problems(Block(ROOT / "README.md", 1, RUNNABLE, text)) == []


def test_a_file_in_an_illustrative_block_is_not_checked():
    assert problems(Block(ROOT / "README.md", 1, "sh", "cat examples/your-own.json")) == []


# ---- the pages --------------------------------------------------------------------------------


def test_the_pages_have_runnable_blocks_and_the_readme_deploys_with_a_token():
    blocks = shell_blocks()
    assert len(blocks) >= 40  # a reader that finds few is wrong
    readme = [b for b in blocks if b.path.name == "README.md" and b.language == RUNNABLE]
    assert len(readme) >= 4
    (deploy,) = [b for b in readme if "docker compose up -d" in b.text]
    lines = [words for words in commands(deploy.text)]
    assert lines.index(["make", "tokens"]) < lines.index(["docker", "compose", "up", "-d"])
    assert "APP_UID=$(id -u)" in deploy.text
    assert "Authorization: Bearer $TOKEN" in deploy.text


@pytest.mark.parametrize("block", shell_blocks(), ids=str)
def test_every_shell_block_matches_the_tree(block):
    assert problems(block) == []


def test_a_numbered_commands_heading_counts_its_block():
    text = (ROOT / "README.md").read_text()
    words = {"One": 1, "Two": 2, "Three": 3, "Four": 4, "Five": 5}
    headings = re.findall(r"^## (\w+) commands\n", text, re.M)
    assert headings, "the README's commands heading is gone"
    for word in headings:
        after = text.split(f"## {word} commands\n", 1)[1]
        block = re.search(r"```\w*\n(.*?)```", after, re.S)[1]
        count = len([line for line in block.splitlines() if re.match(r"^[a-z]", line)])
        assert count == words[word], f"'{word} commands' heads a block of {count}"


def test_a_venv_in_a_hidden_folder_is_not_read_as_the_package(tmp_path):
    (tmp_path / "tool.py").write_text("")
    (tmp_path / ".peers" / "venv" / "lib").mkdir(parents=True)
    (tmp_path / ".peers" / "venv" / "lib" / "site.py").write_text("")
    assert project_sources(tmp_path) == [tmp_path / "tool.py"]
