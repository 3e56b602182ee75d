"""Build this project's images with rootful podman, all its state in one private folder.

`make test-containers` (and `make test`, tests/live/containers) runs this; so can you:

    python tools/podman.py images            # the base image, then the api and trainer targets
    python tools/podman.py podman ps -a      # any podman command on the same private setup
    python tools/podman.py env               # the variables, to run podman yourself

Nothing global is read or changed: podman gets a containers.conf and a storage.conf of its own
(CONTAINERS_CONF, CONTAINERS_STORAGE_CONF) under PODMAN_DIR (default
/var/tmp/estimator-serving-podman), where its images, layers and networks stay between runs.
The configuration is what runs on a sandboxed Debian 12 host: runc (crun fails on hybrid
cgroups), cgroupfs (no systemd), events in a file, and nofile and nproc limits no higher than
this process's hard limits and kernel.pid_max (podman's defaults fail there: "setrlimit ...
Operation not permitted").

No registry is reachable from where this project is tested, so the base image is made here:
`mmdebstrap` (Debian bookworm, minbase, with the host's apt sources) then `podman import`, with
the Python the Dockerfile's stages need; it is tagged by a hash of its recipe, so it is made
once and again only when the recipe changes, and passed as the Dockerfile's PYTHON_IMAGE.
Standard library only: it runs before any virtualenv exists.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PODMAN_DIR = Path(os.environ.get("PODMAN_DIR", "/var/tmp/estimator-serving-podman"))
# The Debian packages this needs on the host (`make containers` installs them as root).
HOST_PACKAGES = ("podman", "runc", "netavark", "aardvark-dns", "iptables", "mmdebstrap")
# What the images' builds trust for pip's downloads: the host's CA bundle, which knows the
# proxy package traffic may pass through. Mounted read-only into the build's RUN steps only;
# the images keep Debian's own bundle.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

# The base image: the interpreter the Dockerfile's stages need, Debian's Python 3.11 (TF 2.15
# supports up to 3.11). Any change here gives a new tag, so a new base and new layers.
BASE_RECIPE = {
    "suite": "bookworm",
    "variant": "minbase",
    "hooks": "merged-usr",
    "packages": ["python3", "python3-venv", "python3-pip", "python-is-python3", "ca-certificates"],
    # Snapshot mirrors serve Release files past their Valid-Until date.
    "aptopts": ['Acquire::Check-Valid-Until "false"'],
    "env": {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
    },
}
BASE_REPOSITORY = "localhost/estimator-serving-base"
# The tags docker-compose.yml and the Kubernetes manifests name.
IMAGES = {
    "api": "localhost/estimator-serving-api:0.1.0",
    "trainer": "localhost/estimator-serving-trainer:0.1.0",
}
APP_UID = 1000


class PodmanError(RuntimeError):
    """A podman or mmdebstrap step failed; the message says which, with its output's tail."""


def base_image_tag(recipe: dict = BASE_RECIPE) -> str:
    """The base image's tag: the first 16 hex digits of the recipe's sha256."""
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()
    return f"{BASE_REPOSITORY}:{digest[:16]}"


def hard_limit(which: int, fallback: int) -> int:
    """This process's hard limit of `which` (RLIMIT_*): the most a container may be given."""
    hard = resource.getrlimit(which)[1]
    return hard if hard != resource.RLIM_INFINITY else fallback


def pid_max() -> int:
    """kernel.pid_max: no process can be given a higher nproc limit here."""
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return 4194304


def write_config(directory: Path = PODMAN_DIR) -> dict[str, str]:
    """Write the private containers.conf and storage.conf; return the variables naming them."""
    directory.mkdir(parents=True, exist_ok=True)
    # Rootful podman raises nofile and nproc to its own defaults unless told; above the
    # sandbox's hard limits, runc's setrlimit fails ("error setting rlimit type 6"). Measured
    # here: conmon, whose child the container is, runs with nproc at most kernel.pid_max.
    nofile = hard_limit(resource.RLIMIT_NOFILE, 1048576)
    nproc = min(hard_limit(resource.RLIMIT_NPROC, 4194304), pid_max())
    containers_conf = directory / "containers.conf"
    storage_conf = directory / "storage.conf"
    containers_conf.write_text(
        "# Written by tools/podman.py: the private podman setup of this project's tests.\n"
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
        f'events_logfile_path = "{directory / "events.log"}"\n'
        "[network]\n"
        f'network_config_dir = "{directory / "networks"}"\n'
    )
    storage_conf.write_text(
        "# Written by tools/podman.py.\n"
        "[storage]\n"
        'driver = "overlay"\n'
        f'graphroot = "{directory / "storage"}"\n'
        f'runroot = "{directory / "run"}"\n'
    )
    return {"CONTAINERS_CONF": str(containers_conf), "CONTAINERS_STORAGE_CONF": str(storage_conf)}


def podman_env(directory: Path = PODMAN_DIR) -> dict[str, str]:
    """The environment every podman command of this project runs with."""
    return {**os.environ, **write_config(directory)}


def cannot_run() -> str | None:
    """Why podman cannot build and run the images on this machine, or None when it can."""
    if sys.platform != "linux":
        return f"rootful podman needs Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return (
            "rootful podman needs root (this project's podman setup is rootful: "
            "runc, cgroupfs, a private storage under /var/tmp)"
        )
    missing = [name for name in ("podman", "runc", "mmdebstrap") if shutil.which(name) is None]
    if missing:
        return (
            f"{', '.join(missing)} not installed: run `make containers` as root "
            f"(apt-get install {' '.join(HOST_PACKAGES)})"
        )
    if not HOST_CA_BUNDLE.is_file():
        return f"{HOST_CA_BUNDLE} is missing: install Debian's ca-certificates"
    return None


def run(command: list[str], *, env: dict[str, str], log: Path | None = None, **kwargs):
    """Run one step; on failure raise PodmanError with the command and the end of its output."""
    if log is None:
        result = subprocess.run(command, env=env, capture_output=True, text=True, **kwargs)
        output = result.stdout + result.stderr
    else:
        with log.open("w") as out:
            result = subprocess.run(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, text=True, **kwargs
            )
        output = log.read_text()
    if result.returncode != 0:
        tail = "\n".join(output.splitlines()[-40:])
        where = f" (whole output: {log})" if log else ""
        raise PodmanError(
            f"{' '.join(command)} failed with exit code {result.returncode}{where}:\n{tail}"
        )
    return result


def image_exists(tag: str, env: dict[str, str]) -> bool:
    return subprocess.run(["podman", "image", "exists", tag], env=env).returncode == 0


def make_base_image(env: dict[str, str], directory: Path = PODMAN_DIR) -> str:
    """The base image for PYTHON_IMAGE: made with mmdebstrap unless its recipe's tag exists."""
    tag = base_image_tag()
    if image_exists(tag, env):
        return tag
    recipe = BASE_RECIPE
    with tempfile.TemporaryDirectory(dir=directory, prefix="base-") as scratch:
        tarball = Path(scratch) / "rootfs.tar"
        command = [
            "nice", "-n", "10", "mmdebstrap",
            f"--variant={recipe['variant']}",
            f"--hook-dir=/usr/share/mmdebstrap/hooks/{recipe['hooks']}",
            f"--include={','.join(recipe['packages'])}",
            *(f"--aptopt={option}" for option in recipe["aptopts"]),
            recipe["suite"], str(tarball),
        ]  # fmt: skip
        # No mirror given: mmdebstrap uses the host's apt sources.
        run(command, env=env, log=directory / "base-image.log")
        changes = [f"--change=ENV {name}={value}" for name, value in recipe["env"].items()]
        run(
            ["podman", "import", *changes, '--change=CMD ["python3"]', str(tarball), tag],
            env=env,
        )
    return tag


def dockerignore_patterns(root: Path = ROOT) -> list[tuple[str, bool]]:
    """The .dockerignore's patterns, in order: (pattern, is an exception `!...`)."""
    patterns = []
    for line in (root / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            negated = line.startswith("!")
            patterns.append((line.lstrip("!").strip("/"), negated))
    return patterns


def _matches(pattern: str, path: str) -> bool:
    """Whether a .dockerignore pattern matches `path` or one of the folders above it."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    if pattern.startswith("**/"):
        tail = pattern[3:]
        return any(fnmatch.fnmatchcase(part, tail) for part in parts)
    depth = pattern.count("/") + 1
    return any(c.count("/") + 1 == depth and fnmatch.fnmatchcase(c, pattern) for c in candidates)


def context_files(root: Path = ROOT) -> list[str]:
    """The build context's files, as the .dockerignore leaves them: the last matching pattern
    decides (an exception `!...` puts a path back)."""
    patterns = dockerignore_patterns(root)

    def excluded(path: str) -> bool:
        verdict = False
        for pattern, negated in patterns:
            if _matches(pattern, path):
                verdict = not negated
        return verdict

    files = []
    for folder, dirs, names in os.walk(root):
        # A folder left out, whose contents no exception could put back, is not walked: the
        # virtualenvs and build/ hold hundreds of thousands of files (25 s of walking here).
        relative = Path(folder).relative_to(root)
        dirs[:] = sorted(
            d
            for d in dirs
            if not excluded((relative / d).as_posix())
            or _may_put_back_below((relative / d).as_posix(), patterns)
        )
        for name in sorted(names):
            path = (relative / name).as_posix()
            if not excluded(path):
                files.append(path)
    return files


def _may_put_back_below(folder: str, patterns: list[tuple[str, bool]]) -> bool:
    """Whether an exception (`!...`) could match a path inside `folder`."""
    parts = folder.split("/")
    for pattern, negated in patterns:
        if not negated:
            continue
        if pattern.startswith("**/"):
            return True
        leading = pattern.split("/")
        if len(leading) > len(parts) and all(
            fnmatch.fnmatchcase(part, wanted)
            for part, wanted in zip(parts, leading[: len(parts)], strict=True)
        ):
            return True
    return False


def build_key(target: str, base: str, root: Path = ROOT) -> str:
    """A sha256 of everything a target's build reads: the Dockerfile, the context's files
    (paths and contents), the target and the build arguments. Equal keys, equal images."""
    digest = hashlib.sha256()
    for part in (target, base, str(APP_UID), (root / "Dockerfile").read_text()):
        digest.update(part.encode() + b"\0")
    for path in context_files(root):
        digest.update(path.encode() + b"\0" + (root / path).read_bytes() + b"\0")
    return digest.hexdigest()


def image_id(tag: str, env: dict[str, str]) -> str | None:
    """The id of the image `tag` names, or None when there is none."""
    result = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Id}}", tag],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    return result.stdout.strip() if result.returncode == 0 else None


def built_from(target: str, env: dict[str, str], directory: Path = PODMAN_DIR) -> str | None:
    """The build key the image now tagged for `target` was built from, or None if unknown.

    Kept in a file beside the storage, with the image's id: a label would not do, since
    buildah leaves a `--label` off a target that is not the Dockerfile's last stage when every
    layer comes from the cache.
    """
    record = directory / "build-keys" / f"{target}.json"
    try:
        recorded = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    if recorded.get("id") != image_id(IMAGES[target], env):
        return None
    return recorded.get("key")


def build_image(target: str, base: str, env: dict[str, str], directory: Path = PODMAN_DIR) -> str:
    """`podman build` one Dockerfile target on the local base, unless the image with its tag
    was built from the same inputs (build_key): even a build whose every layer is cached
    reads every file of the context and starts a builder per stage."""
    tag = IMAGES[target]
    key = build_key(target, base)
    if built_from(target, env, directory) == key:
        return tag
    # The build reads a context of the .dockerignore's files alone, copied out of the checkout:
    # the builder would otherwise walk every file of the checkout's venvs to apply it.
    context = directory / "context"
    shutil.rmtree(context, ignore_errors=True)
    for path in context_files():
        (context / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, context / path)
    command = [
        "nice", "-n", "10", "podman", "build",
        # The docker format keeps HEALTHCHECK (OCI images have no such field).
        "--format", "docker",
        "--network", "host",
        "--layers",
        "--target", target,
        "--build-arg", f"PYTHON_IMAGE={base}",
        "--build-arg", f"APP_UID={APP_UID}",
        "--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro",
        "--tag", tag,
        "--file", str(ROOT / "Dockerfile"),
        str(context),
    ]  # fmt: skip
    try:
        run(command, env=env, log=directory / f"build-{target}.log")
    finally:
        shutil.rmtree(context, ignore_errors=True)
    record = directory / "build-keys" / f"{target}.json"
    record.parent.mkdir(exist_ok=True)
    record.write_text(json.dumps({"key": key, "id": image_id(tag, env)}))
    return tag


def build_images(directory: Path = PODMAN_DIR, out=sys.stderr) -> dict[str, str]:
    """The base image and both targets; returns {target: tag}. Prints each step's time."""
    env = podman_env(directory)
    started = time.monotonic()
    base = make_base_image(env, directory)
    print(f"podman: base image {base} ({time.monotonic() - started:.0f} s)", file=out)
    tags = {}
    for target in IMAGES:
        step = time.monotonic()
        tags[target] = build_image(target, base, env, directory)
        print(f"podman: {tags[target]} ({time.monotonic() - step:.0f} s)", file=out)
    return tags


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/podman.py", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("images", help="make the base image, build the api and trainer targets")
    commands.add_parser("env", help="print the variables that select the private setup")
    commands.add_parser("check", help="say whether podman can run here (exit 1 if not)")
    passthrough = commands.add_parser("podman", help="run podman with the private setup")
    passthrough.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)

    if args.command == "env":
        for name, value in write_config().items():
            print(f"export {name}={value}")
        return 0
    reason = cannot_run()
    if args.command == "check":
        print(reason or "podman can build and run the images here")
        return 1 if reason else 0
    if reason:
        print(f"tools/podman.py: {reason}", file=sys.stderr)
        return 1
    if args.command == "podman":
        return subprocess.run(["podman", *args.args], env=podman_env()).returncode
    try:
        build_images()
    except PodmanError as err:
        print(f"tools/podman.py: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
