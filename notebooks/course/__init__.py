"""The course's notebooks as Python: one module a notebook (`NAME`, `CELLS`), so each chapter can be
read, reviewed and changed on its own. `notebooks/build_notebooks.py` writes and executes them."""
