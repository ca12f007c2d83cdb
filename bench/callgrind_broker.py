"""`python -m callgrind_broker --config ...`: the broker run under valgrind's callgrind, counting
nothing until `callgrind_control -i on PID` (bench/request_instructions.py turns it on around a
workload). The count file goes where $STRATA_CALLGRIND_OUT says (%p: the process id)."""

import os
import sys

out = os.environ.get("STRATA_CALLGRIND_OUT", "callgrind.%p")
os.execvp("valgrind", ["valgrind", "--tool=callgrind", "--instr-atstart=no", "-q", f"--callgrind-out-file={out}",
                       sys.executable, "-P", "-m", "broker", *sys.argv[1:]])
