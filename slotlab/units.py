"""Units as llama-server prints them: sizes in MiB are `bytes / (1024.0 * 1024.0)`."""

MIB = 1024.0 * 1024.0


def cache_ram_bytes(cache_ram_mib: int) -> int:
    """`--cache-ram` (MiB) as the RAM cache's byte limit, as `load_model` computes it (SC:1332-1344):
    `1024 * 1024 * MiB`; a negative value means no byte limit (0)."""
    return 1024 * 1024 * max(0, int(cache_ram_mib))
