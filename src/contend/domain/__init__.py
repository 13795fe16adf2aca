"""Pure domain logic: no I/O, no asyncio, nothing else of contend imported."""
