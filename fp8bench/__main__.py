from fp8bench.cli import entry

entry()
