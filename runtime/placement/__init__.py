"""Where a call's tensors live and how their bytes reach the file.

Holds the protocol (:mod:`.placement_protocol`), the choice of placement (:mod:`.choice`),
the local one (:mod:`.local_placement`), the sharded one (:mod:`.sharded_placement`, its
collectives in :mod:`.collectives`), a sharded call's path (:mod:`.io_choice`,
:mod:`.sharded_io`) and the parallel path where every rank reads and writes its own bytes
(:mod:`.positional`).

May import: ``tlckpt.codec``, :mod:`..binding`, torch.
"""
