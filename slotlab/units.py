"""Units as llama-server prints them: sizes in MiB are `bytes / (1024.0 * 1024.0)`."""

MIB = 1024.0 * 1024.0
