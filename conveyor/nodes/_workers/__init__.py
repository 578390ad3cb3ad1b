"""Worker machinery of conveyor's nodes: threads, worker processes, and what passes between them.

Private to ``conveyor.nodes``: the ops use these parts, nothing above the nodes does.

map (``map.py``, ``map_batches.py``):
    ``map_engines``       the engines behind one interface: inline, ordered threads, processes
    ``map_calls``         what a worker runs per item (``Call``) and a failure carried back
    ``ordered_threads``   persistent threads that give results in input order
    ``batch_slabs``       batch-shaped arrays a threaded map writes into, for collate
    ``torchdata_threads`` stopping torchdata's threaded iterators; errors carried as values
copies (``copies.py``):
    ``copy_worker``       a worker's side: build one copy of the sub-graph, send its chunks
    ``worker_pipe``       the pipe a worker process writes its chunks to
    ``chunk_packing``     a chunk pickled once, its tensors in one buffer or in shared memory
    ``shared_slots``      shared-memory slots a worker lends the main process, reused
    ``ray_actors``        copies as Ray actors (``method: ray``): calls for credits, restarts
    ``named_slots``       those slots as files, for an actor on the driver's node
processes (both):
    ``child_processes``   the main process's view of its workers; ending them within a bound
    ``parent_watch``      a worker process ends with the process that started it
"""
