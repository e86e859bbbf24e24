"""File I/O below every family: sources, atomic writes, vectored transfers.

Holds :mod:`.source` (a file opened for reading, its stamp, bounded reads), :mod:`.atomic`
(write a temporary, fsync, rename, fsync the folder), :mod:`.writeback` (the disk asked
to start writing a durable save's bytes as they come, so its ``fsync`` waits less),
:mod:`.transfer` (payloads moved by address with ``preadv``/``pwritev``, on the threads of
:mod:`.threads`), :mod:`.leases` (read leases: a file nobody can change while a load reads
it), :mod:`.mapped` (a leased file's warm pages copied from a mapping of it),
:mod:`.staging` (byte comparison of staged buffers), :mod:`.gcpause` (the garbage collector
held off during a large read) and :mod:`.interrupts` (Ctrl-C deferred while live state is
written).

May import: :mod:`..errors`, :mod:`..paths`. Nothing of a family, no ``formats``.
"""
