"""llama.cpp's vendored server tests are not collected by slotlab's own pytest run: they need their
own requirements and a server binary, and `run_server_tests.py` runs them in a scratch copy."""

collect_ignore = ["vendor"]
