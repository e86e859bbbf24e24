"""Checkpoint sets: a folder of member files, a manifest, digests, an atomic commit.

Holds the documents (:mod:`.set_documents`, :mod:`.set_document_writing`,
:mod:`.set_document_checks`; the version-2 manifest, :mod:`.set_manifest_v2`; the
version-3 manifest of a set of one state tree, :mod:`.set_manifest_v3`;
:mod:`.exact_values`, :mod:`.rng_states`), keys and digests (:mod:`.set_keys`,
:mod:`.set_digests`), the folders (:mod:`.set_folders`), the commit (:mod:`.set_commit`; the
folder locks and renames it shares with the cleaners, :mod:`.set_folder_moves`) and a set's
verification (:mod:`.checkpoint_set`); sets on object storage, any fsspec filesystem, imported
lazily (:mod:`.remote_store`, :mod:`.remote_upload`, :mod:`.remote_leases`,
:mod:`.remote_set_writer`, :mod:`.remote_set_reading`). torch-free (verification needs no
torch).

May import: ``formats``, the codec's faces (:mod:`..errors`, :mod:`..families`,
:mod:`..inspection`), :mod:`..fileio`, :mod:`..exact_json`.
"""
