#!/usr/bin/python3
"""torchrun for Debian's python3-torch 1.13 on Python 3.11.

Debian's /usr/bin/torchrun dies before starting any worker with
"'NoneType' object has no attribute 'get'": Std.from_str() looks a value up by
iterating the IntFlag `Std`, and since Python 3.11 iterating a Flag yields only
its single-bit members, so "0" (NONE, the default of --redirects and --tee) and
"3" (ALL) map to None. Replace from_str with a direct conversion, then hand the
command line to torch.distributed.run.main() unchanged.

Usage: /usr/bin/python3 torchrun_launch.py [torchrun options] script.py [args]
"""
import re
import sys

from torch.distributed.elastic.multiprocessing import api as _mp_api


def _std_from_str(cls, vm):
    if re.match(_mp_api._VALUE_REGEX, vm):  # one value for every local rank
        return cls(int(vm))
    if re.match(_mp_api._MAPPING_REGEX, vm):  # "local_rank:value,..."
        return {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm} does not match <{_mp_api._VALUE_REGEX}> or <{_mp_api._MAPPING_REGEX}>")


_mp_api.Std.from_str = classmethod(_std_from_str)

if __name__ == "__main__":
    from torch.distributed.run import main

    sys.exit(main())
