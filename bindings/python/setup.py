"""Build of ccq's Python extension (ccq._ccq) over libccq.

Where libccq comes from:

* ``CCQ_LIB_DIR`` set: a directory holding a built or installed ``libccq.so`` (a CMake build
  directory, or ``$PREFIX/lib``). The extension links it there and finds it there at run time
  (an rpath); nothing is copied. Headers: ``CCQ_INCLUDE_DIR``, else this repository's
  ``include/``, else ``$CCQ_LIB_DIR/../include``.
* otherwise: this repository's CMake project (``CCQ_SOURCE_DIR``, default ``../..``) is
  configured and built in the build directory (tests, examples off; ``CCQ_WITH_NCCL`` and
  ``CCQ_WITH_MPI`` pass through, default AUTO), installed into a staging prefix, and its
  shared libraries (``libccq.so.0`` and any module ``libccq-*.so.0`` next to it, which libccq
  loads from its own directory) are copied into the package; the extension finds them with
  an rpath of ``$ORIGIN``.

``CCQ_WERROR=1`` turns the extension's warnings into errors (scripts/test.sh sets it).
"""

import glob
import os
import re
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.environ.get("CCQ_SOURCE_DIR", os.path.join(HERE, "..", "..")))


def version():
    """The C library's version (include/ccq/version.h) is the package's."""
    for inc in filter(None, [os.environ.get("CCQ_INCLUDE_DIR"), os.path.join(SOURCE, "include"),
                             os.environ.get("CCQ_LIB_DIR") and
                             os.path.join(os.environ["CCQ_LIB_DIR"], "..", "include")]):
        path = os.path.join(inc, "ccq", "version.h")
        if os.path.exists(path):
            text = open(path).read()
            parts = [re.search(r"#define CCQ_VERSION_%s (\d+)" % p, text).group(1)
                     for p in ("MAJOR", "MINOR", "PATCH")]
            return ".".join(parts)
    raise SystemExit("ccq: cannot find include/ccq/version.h: set CCQ_SOURCE_DIR to a ccq "
                     "checkout, or CCQ_LIB_DIR (and CCQ_INCLUDE_DIR) to a built ccq")


class BuildExt(build_ext):
    def build_extension(self, ext):
        lib_dir = os.environ.get("CCQ_LIB_DIR")
        if lib_dir:
            lib_dir = os.path.abspath(lib_dir)
            include = os.environ.get("CCQ_INCLUDE_DIR") or next(
                (d for d in (os.path.join(SOURCE, "include"), os.path.join(lib_dir, "..", "include"))
                 if os.path.exists(os.path.join(d, "ccq.h"))), None)
            if include is None:
                raise SystemExit("ccq: no ccq.h: set CCQ_INCLUDE_DIR")
            ext.runtime_library_dirs = [lib_dir]
            # A libccq bundled by an earlier build in this build directory must not ship.
            for stale in glob.glob(os.path.join(self.build_lib, "ccq", "libccq*.so.*")):
                os.remove(stale)
        else:
            lib_dir, include = self.build_libccq()
            ext.runtime_library_dirs = ["$ORIGIN"]
        ext.include_dirs = [include]
        ext.library_dirs = [lib_dir]
        ext.libraries = ["ccq"]
        # setuptools rebuilds only when a source is newer than the extension: a build against
        # another libccq (another CCQ_LIB_DIR, or the bundled one) must relink (its rpath).
        stamp = os.path.join(self.build_temp, "ccq-linked-against")
        os.makedirs(self.build_temp, exist_ok=True)
        if not os.path.exists(stamp) or open(stamp).read() != lib_dir:
            self.force = True
        super().build_extension(ext)
        with open(stamp, "w") as f:
            f.write(lib_dir)

    def build_libccq(self):
        """Configure, build and stage this repository's libccq; copy its shared objects next
        to the extension. Returns (directory to link from, include directory)."""
        if not os.path.exists(os.path.join(SOURCE, "CMakeLists.txt")):
            raise SystemExit("ccq: %s is not a ccq checkout: set CCQ_SOURCE_DIR, or CCQ_LIB_DIR "
                             "to a built or installed libccq" % SOURCE)
        build = os.path.abspath(os.path.join(self.build_temp, "libccq"))
        stage = os.path.abspath(os.path.join(self.build_temp, "libccq-stage"))
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(min(os.cpu_count() or 2, 8)))
        run = lambda *cmd: subprocess.check_call(list(cmd))  # noqa: E731
        run("cmake", "-S", SOURCE, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
            "-DCCQ_BUILD_TESTS=OFF", "-DCCQ_BUILD_EXAMPLES=OFF", "-DCCQ_BUILD_BENCH=OFF",
            "-DCCQ_WITH_NCCL=" + os.environ.get("CCQ_WITH_NCCL", "AUTO"),
            "-DCCQ_WITH_MPI=" + os.environ.get("CCQ_WITH_MPI", "AUTO"),
            # The staged library keeps its rpath to CUDA, NCCL and MPI where they are not in
            # the loader's path.
            "-DCMAKE_INSTALL_RPATH_USE_LINK_PATH=ON", "-DCMAKE_INSTALL_LIBDIR=lib")
        run("cmake", "--build", build, "-j", jobs)
        shutil.rmtree(stage, ignore_errors=True)
        run("cmake", "--install", build, "--prefix", stage)
        lib = os.path.join(stage, "lib")
        # Wheels hold no symlinks: copy each shared object under its soname (libccq.so.0).
        pkg = os.path.join(os.path.abspath(self.build_lib), "ccq")
        os.makedirs(pkg, exist_ok=True)
        copied = 0
        # Modules may be installed beside libccq or below it: all go next to it in the package,
        # where libccq looks for them first.
        for path in glob.glob(os.path.join(stage, "**", "libccq*.so.*"), recursive=True):
            m = re.match(r"(libccq[^/]*\.so\.\d+)(\.|$)", os.path.basename(path))
            if m and not os.path.islink(path):
                shutil.copy2(path, os.path.join(pkg, m.group(1)))
                copied += 1
        if not copied:
            raise SystemExit("ccq: the CMake build installed no libccq*.so.* in " + stage)
        return lib, os.path.join(stage, "include")


ext = Extension(
    "ccq._ccq",
    sources=sorted(glob.glob(os.path.join("csrc", "*.c"))),
    depends=[os.path.join("csrc", "ccqpy.h")],
    extra_compile_args=["-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers",
                        "-Wno-cast-function-type"]
    + (["-Werror"] if os.environ.get("CCQ_WERROR") == "1" else []),
)

setup(version=version(), ext_modules=[ext], cmdclass={"build_ext": BuildExt})
