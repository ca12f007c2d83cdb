"""Dev cluster launcher used by `make run`.

The broker and controller processes arrive with the "Broker and controller core" issue;
until then this says so plainly instead of pretending to start something.
"""

import sys


def main() -> int:
    print("strata: the protocol core is installed; the broker/controller processes are not built yet.", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
