"""The one compiled module: the Spark source's record scanner (connector/_record_scan.c).

Everything else is in pyproject.toml. The extension is optional so that a broker-only install
without a C compiler (the Docker image's slim base) still installs; the Spark source needs it and
says so when it is missing.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("connector._record_scan", ["connector/_record_scan.c"], optional=True,
                             extra_compile_args=["-O2"])])
