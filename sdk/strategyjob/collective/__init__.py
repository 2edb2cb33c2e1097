"""Collectives: ``CommunicationOptions``, the in-process rendezvous of one process's replica
threads (``local``), ``torch.distributed`` process groups with timeouts that name a dead peer
(``process_group``) and say whom they wait for (``waiting``), the interface strategies hold
for their cross-worker collectives, with its in-process and process-group implementations
(``backend``), and gradient synchronisation of torch modules (``grad_sync``).

Submodules are imported where they are used, so ``strategyjob.experimental.CommunicationOptions``
stays cheap to import.
"""
