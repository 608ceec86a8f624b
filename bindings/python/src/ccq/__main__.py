"""python3 -m ccq --version | --config"""

import argparse
import sys

import ccq


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m ccq", description=__doc__)
    p.add_argument("--version", action="store_true",
                   help="the package's version, and the libccq it loaded")
    p.add_argument("--config", action="store_true",
                   help="ccq_config as Runtime() would start from (defaults + CCQ_* variables)")
    a = p.parse_args(argv)
    if a.config:
        for k, v in ccq.config_defaults().items():
            print("%s = %r" % (k, v))
    if a.version or not a.config:
        print("ccq %s (libccq %s, %s)" % (ccq.__version__, ccq.library_version(),
                                          ccq.library_path()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
