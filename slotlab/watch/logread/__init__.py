"""The families of lines `slotlab.watch.log_reader.LogReader` reads, one module each (see its docstring);
`state.py` holds what the reader keeps between lines."""
