"""CPU-safe variant of vLLM's ExampleHiddenStatesConnector.

The stock connector's worker-side `_submit_async_write` is CUDA-only: it
creates a `torch.cuda.Stream`, records `torch.cuda.Event`s and allocates a
`pin_memory=True` host buffer for an async DtoH copy. On a CPU-only torch build
those calls fail. On CPU the KV cache already lives in host memory, so we
gather the slots synchronously, hand a plain CPU tensor to the stock writer
thread pool, and use an always-complete event stand-in.

Everything else (scheduler-side bookkeeping, lock files, file naming via
`shared_storage_path`, `_write_tensors`, `get_finished`) is inherited unchanged.

Loaded by the vLLM server that remote/specops_host/data/datagen.py starts on cpu hosts:
  --kv_transfer_config '{"kv_connector":"CPUHiddenStatesConnector",
     "kv_connector_module_path":"specops_host.serve.cpu_hs_connector", "kv_role":"kv_producer",
     "kv_connector_extra_config":{"shared_storage_path":"<data>/.hs_stage"}}'
with <workdir> on PYTHONPATH (vllm_server.server_env) so the engine-core subprocess can import it.
"""

from __future__ import annotations

import fcntl
import os
from functools import partial

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (  # noqa: E501
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _CompletedEvent:
    """Stand-in for torch.cuda.Event: the CPU gather is already done."""

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class CPUHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None

        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slot_mapping = (block_ids[:, None] * self._block_size + offsets).flatten()
        num_tokens = pending.token_ids.shape[0]
        # [num_tokens, num_aux_layers, hidden]; clone so the KV blocks can be
        # freed/reused while the writer thread serializes.
        hidden_states = extract_from_kv_cache(
            self._kv_cache, slot_mapping, num_tokens
        ).clone()
        tensors = {
            "hidden_states": hidden_states,
            "token_ids": pending.token_ids.clone(),
        }

        assert self._req_futures.get(pending.req_id) is None
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(
                pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644
            )
            fcntl.flock(lock_fd, fcntl.LOCK_EX)

        done = _CompletedEvent()
        future = self._executor.submit(
            self._write_tensors, tensors, done, pending.filename, lock_fd
        )
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
