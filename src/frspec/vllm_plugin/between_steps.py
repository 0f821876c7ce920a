"""What changes between vLLM steps: before the V1 runner asks its drafter for drafts, the drafter's context rows
(batch_context.py) and its map size (batch_map_size.py) are brought up to date with the running batch. Both read
only the input batch's host copy of the tokens, so this costs no device synchronisation, and both run before the
drafter, so each proposal is drafted from one set of rows."""

from __future__ import annotations


def hook_runner_drafting() -> None:
    """Update a drafter's per-step state before the V1 runner asks it for drafts (idempotent; runners whose
    drafter has neither `frspec_context` nor `frspec_map_size` are unaffected). V2 runners are refused at start-up
    for both (startup_check.py)."""
    from frspec.vllm_plugin import internals

    def make(original):
        def propose_draft_token_ids(self, *args, **kwargs):
            drafter = getattr(self, "drafter", None)
            states = [s for s in (getattr(drafter, "frspec_context", None), getattr(drafter, "frspec_map_size", None))
                      if s is not None]
            if states:
                # The running requests and their tokens (prompt, then generated), as vLLM's input batch holds them.
                batch = self.input_batch
                n = batch.num_reqs
                for state in states:
                    state.update(list(batch.req_ids[:n]), batch.token_ids_cpu, batch.num_tokens_no_spec[:n])
            return original(self, *args, **kwargs)

        return propose_draft_token_ids

    internals.patch_method("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.propose_draft_token_ids", make)
