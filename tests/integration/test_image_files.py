"""The container image cannot fall behind the build (issue 40), checked
without building it (deploy/build-image.sh builds and runs the image):

- the Debian packages the build needs, derived from every CMakeLists.txt
  (pkg_check_modules, find_path, find_program, find_library, resolved to the
  package owning the file), are in scripts/packages/build.txt; the
  Dockerfile's stages and scripts/setup.sh install those lists and no
  package of their own;
- every backend the build produces under build/backends/ (each backend
  library, ONNX Runtime, the whole python/ folder) is part of the nereid_dist
  target the image builds and is copied by deploy/stage.sh, whose output the
  runtime stage takes whole;
- every shared library those files link comes from a package of
  scripts/packages/runtime.txt (libtorch-runtime.txt for the PyTorch backend);
- the Kubernetes manifests run the image deploy/build-image.sh builds.
"""
import glob
import os
import re
import shutil
import subprocess

import pytest
import yaml

from conftest import BUILD, ROOT

DOCKERFILE = os.path.join(ROOT, "deploy", "Dockerfile")
PACKAGES = os.path.join(ROOT, "scripts", "packages")
CMAKE_FILES = {"CMakeFiles", "Makefile", "cmake_install.cmake", "CTestTestfile.cmake", "__pycache__"}


def package_list(*lists):
    out = subprocess.run(["bash", os.path.join(PACKAGES, "apt-install.sh"), "--print", *lists],
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


def dockerfile_stages():
    """The Dockerfile as [(FROM line, [instructions])], continuation lines joined."""
    with open(DOCKERFILE) as f:
        text = re.sub(r"\\\n", " ", "".join(line for line in f if not line.lstrip().startswith("#")))
    stages = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.upper().startswith("FROM "):
            stages.append((line, []))
        elif stages:
            stages[-1][1].append(line)
    return stages


def owners(paths):
    """{path: Debian package} for the paths dpkg knows (usr-merged or not)."""
    variants = {}
    for p in paths:
        for v in {p, os.path.realpath(p), re.sub(r"^/usr/", "/", p), re.sub(r"^/(lib|bin|sbin)/", r"/usr/\1/", p)}:
            variants.setdefault(v, p)
    r = subprocess.run(["dpkg", "-S", *sorted(variants)], capture_output=True, text=True)
    found = {}
    for line in r.stdout.splitlines():
        pkgs, _, path = line.partition(": ")
        if path in variants and "," not in pkgs and not pkgs.startswith("diversion"):
            found[variants[path]] = pkgs.split(":")[0]
    return found


def cmake_calls(name):
    """(file, argument list) for each call `name(...)` in the project's CMakeLists."""
    files = [os.path.join(ROOT, "CMakeLists.txt")] + sorted(glob.glob(os.path.join(ROOT, "*", "*", "CMakeLists.txt")))
    for path in files:
        with open(path) as f:
            text = re.sub(r"#[^\n]*", "", f.read())
        for m in re.finditer(r"\b%s\s*\(([^)]*)\)" % name, text):
            yield path, m.group(1).split()


def build_requirements():
    """{what CMakeLists needs: file on this machine that provides it}; the
    names the build REQUIRES and, as optional, find_library's (LibTorch)."""
    needed, optional = {}, {}
    for _, args in cmake_calls("pkg_check_modules"):
        if "REQUIRED" in args:
            for mod in [a for a in args[1:] if a not in ("REQUIRED", "IMPORTED_TARGET", "QUIET")]:
                pc = subprocess.run(["pkg-config", "--path", mod], capture_output=True, text=True)
                assert pc.returncode == 0, f"pkg-config module {mod} is not installed: run scripts/setup.sh"
                needed[f"pkg-config {mod}"] = pc.stdout.strip()
    for _, args in cmake_calls("find_path"):
        hits = [os.path.join(d, args[1]) for d in ("/usr/include", "/usr/include/x86_64-linux-gnu")
                if os.path.exists(os.path.join(d, args[1]))]
        target = needed if "REQUIRED" in args else optional
        if hits:
            target[f"header {args[1]}"] = hits[0]
        else:
            assert "REQUIRED" not in args, f"header {args[1]} not found: run scripts/setup.sh"
    for _, args in cmake_calls("find_program"):
        exe = shutil.which(args[1])
        assert exe or "REQUIRED" not in args, f"program {args[1]} not found: run scripts/setup.sh"
        if exe:
            (needed if "REQUIRED" in args else optional)[f"program {args[1]}"] = exe
    for _, args in cmake_calls("find_library"):
        lib = f"/usr/lib/x86_64-linux-gnu/lib{args[1]}.so"
        if os.path.exists(lib):
            (needed if "REQUIRED" in args else optional)[f"library {args[1]}"] = lib
    return needed, optional


def test_build_packages_derive_from_cmakelists():
    needed, optional = build_requirements()
    assert len(needed) >= 10, needed  # the parse found the requirements
    pkgs = owners(list(needed.values()) + list(optional.values()))
    build, torch = package_list("build"), package_list("libtorch-build")
    missing = {what: pkgs.get(path, f"no package owns {path}") for what, path in needed.items()
               if pkgs.get(path) not in build}
    assert not missing, f"scripts/packages/build.txt lacks what CMakeLists.txt requires: {missing}"
    missing = {what: pkgs.get(path) for what, path in optional.items()
               if pkgs.get(path) not in build | torch}
    assert not missing, f"scripts/packages lacks what CMakeLists.txt looks for: {missing}"
    assert {"build-essential", "cmake", "pkg-config"} <= build


def test_dockerfile_installs_the_package_lists():
    stages = dockerfile_stages()
    assert len(stages) >= 2, "deploy/Dockerfile is multi-stage"
    with open(DOCKERFILE) as f:
        assert re.search(r"^ARG BASE=debian:bookworm-slim$", f.read(), re.M)
    for from_line, _ in stages:
        assert from_line.startswith("FROM ${BASE}"), from_line
    build = [s for s in stages if re.search(r"\bAS build$", s[0], re.I)]
    assert build, "deploy/Dockerfile has a stage named build"
    wanted = {build[0][0]: ("build", "libtorch-build"), stages[-1][0]: ("runtime", "libtorch-runtime")}
    for from_line, lines in stages:
        text = "\n".join(lines)
        assert not re.search(r"apt(-get)?\s+install", text), \
            f"{from_line}: install Debian packages from scripts/packages/*.txt (apt-install.sh), not inline"
        if from_line in wanted:
            assert any(re.match(r"COPY (--\S+ )*scripts/packages/? ", l) for l in lines), \
                f"{from_line}: COPY scripts/packages/ into the stage"
            for lst in wanted[from_line]:
                assert re.search(r"bash \S*scripts/packages/apt-install\.sh %s\b" % lst, text) or \
                    re.search(r"bash /tmp/packages/apt-install\.sh %s\b" % lst, text), \
                    f"{from_line}: does not install scripts/packages/{lst}.txt"
    runtime = package_list("runtime")
    assert {"python3", "python3-numpy"} <= runtime


def test_setup_installs_the_same_lists():
    with open(os.path.join(ROOT, "scripts", "setup.sh")) as f:
        setup = re.sub(r"#[^\n]*", "", f.read())
    assert not re.search(r"\bapt(-get)?\s+install\b", setup), \
        "scripts/setup.sh installs Debian packages only from scripts/packages/*.txt (apt-install.sh)"
    calls = re.findall(r"scripts/packages/apt-install\.sh((?: [\w-]+)+)", setup)
    lists = {name for call in calls for name in call.split()}
    for lst in ("build", "runtime", "libtorch-build", "libtorch-runtime"):
        assert lst in lists, f"scripts/setup.sh does not install scripts/packages/{lst}.txt"
    # every list file is installed by setup.sh, and each name is a plain package name
    files = {os.path.basename(p)[:-4] for p in glob.glob(os.path.join(PACKAGES, "*.txt"))}
    assert files <= lists, f"lists setup.sh leaves out: {files - lists}"
    for name in package_list(*files):
        assert re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", name), name
    # ONNX Runtime comes the same way to both
    assert "scripts/fetch_onnxruntime.sh" in setup
    build = [lines for f, lines in dockerfile_stages() if re.search(r"\bAS build$", f, re.I)][0]
    assert any(l.startswith("RUN ") and re.search(r"\bbash \S*scripts/fetch_onnxruntime\.sh", l)
               for l in build), "the Dockerfile's build stage runs scripts/fetch_onnxruntime.sh"


def produced_backends():
    """Files of build/backends/ the server loads: every shared library and the
    whole python/ folder, without CMake's own files."""
    root = os.path.join(BUILD, "backends")
    if not os.path.isdir(root):
        pytest.skip(f"{root} not built")
    found = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in CMAKE_FILES]
        rel = os.path.relpath(d, root)
        for f in files:
            if f in CMAKE_FILES:
                continue
            if re.search(r"\.so(\.\d+)*$", f) or rel == "python" or rel.startswith("python/"):
                found.append(os.path.normpath(os.path.join(rel, f)))
    return sorted(found)


def dist_dependencies():
    """Targets nereid_dist depends on, transitively, from the build's Makefiles."""
    makefile2 = os.path.join(BUILD, "CMakeFiles", "Makefile2")
    if not os.path.exists(makefile2):
        pytest.skip("the build is not a Makefile build")
    deps = {}
    with open(makefile2) as f:
        for m in re.finditer(r"^(?:\S*/)?CMakeFiles/([\w.-]+)\.dir/all: (?:\S*/)?CMakeFiles/([\w.-]+)\.dir/all$",
                             f.read(), re.M):
            deps.setdefault(m.group(1), set()).add(m.group(2))
    seen, todo = set(), ["nereid_dist"]
    while todo:
        for d in deps.get(todo.pop(), ()):
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


def test_every_built_backend_goes_into_the_image(tmp_path):
    produced = produced_backends()
    libs = [p for p in produced if os.path.basename(p).startswith("libnereid_")]
    assert libs and "python/nereid_python_stub.py" in produced and "libonnxruntime.so.1" in produced, produced

    # the image builds nereid_dist: it depends on every backend target
    dist = dist_dependencies()
    assert {"nereid", "tritonserver"} <= dist, dist
    for lib in libs:
        target = re.sub(r"^lib(nereid_\w+)\.so$", r"\1", os.path.basename(lib))
        assert target in dist, f"{lib} is built by {target}, which nereid_dist does not build"

    # deploy/stage.sh copies each of them
    dest = tmp_path / "opt"
    subprocess.run(["bash", os.path.join(ROOT, "deploy", "stage.sh"), BUILD, str(dest)], check=True,
                   env=dict(os.environ, STRIP="true"))
    missing = [p for p in produced if not (dest / "backends" / p).is_file()]
    assert not missing, f"deploy/stage.sh leaves out {missing}"
    assert (dest / "bin" / "nereid").is_file() and (dest / "bin" / "libtritonserver.so").is_file()
    junk = [str(p) for p in dest.rglob("*") if p.name in CMAKE_FILES or p.suffix == ".o"]
    assert not junk, junk

    # ... and the Dockerfile builds nereid_dist, stages it, and ships the staged tree whole
    stages = dockerfile_stages()
    build = "\n".join(next(lines for f, lines in stages if re.search(r"\bAS build$", f, re.I)))
    assert re.search(r"cmake --build /build .*--target nereid_dist\b", build), build
    assert "-DNEREID_BACKEND_DIR=/opt/nereid/backends" in build
    assert re.search(r"bash /src/deploy/stage\.sh /build /opt/nereid\b", build), build
    assert "COPY --from=build /opt/nereid /opt/nereid" in stages[-1][1]


def elf_needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def test_linked_libraries_come_from_the_runtime_list(tmp_path):
    dest = tmp_path / "opt"
    if not os.path.exists(os.path.join(BUILD, "nereid")):
        pytest.skip("not built")
    if any(re.match(r"lib[almt]san\.", lib) for lib in elf_needed(os.path.join(BUILD, "nereid"))):
        # A sanitizer build links every library pkg-config names (no
        # --as-needed: libcares, libssl, abseil...); the image is built in
        # release mode, which make test checks here.
        pytest.skip("a sanitizer build: the image is never one")
    subprocess.run(["bash", os.path.join(ROOT, "deploy", "stage.sh"), BUILD, str(dest)], check=True,
                   env=dict(os.environ, STRIP="true"))
    ldconfig = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    where = {}
    for m in re.finditer(r"^\s*(\S+) \(libc6,x86-64[^)]*\) => (\S+)$", ldconfig, re.M):
        where.setdefault(m.group(1), m.group(2))
    shipped = {p.name for p in dest.rglob("*.so*")}
    needs = {}
    for elf in [dest / "bin" / "nereid"] + sorted(dest.rglob("*.so*")):
        for lib in elf_needed(str(elf)):
            if lib not in shipped:
                assert lib in where, f"{elf.name} needs {lib}, which is not installed here"
                needs.setdefault(where[lib], set()).add(elf.name)
    assert len(needs) >= 8, needs
    pkgs = owners(list(needs))
    runtime, torch = package_list("runtime"), package_list("libtorch-runtime")
    for path, users in needs.items():
        allowed = runtime | torch if users == {"libnereid_pytorch.so"} else runtime
        assert pkgs.get(path) in allowed, \
            f"{sorted(users)} link {path} (package {pkgs.get(path)}), not in scripts/packages/runtime.txt"


def test_k8s_manifests_run_the_image_the_script_builds():
    with open(os.path.join(ROOT, "deploy", "build-image.sh")) as f:
        tag = re.search(r"^TAG=\$\{1:-([^}]+)\}$", f.read(), re.M).group(1)
    images = []
    for path in glob.glob(os.path.join(ROOT, "deploy", "k8s", "*.yaml")):
        with open(path) as f:
            text = f.read()
        images += re.findall(r"^\s*image:\s*(\S+)", text, re.M)
        list(yaml.safe_load_all(text))
    assert images and set(images) == {tag}, f"deploy/k8s images {set(images)}, build-image.sh builds {tag}"
