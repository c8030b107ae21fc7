"""The Turing (T4, sm_75) attention fix for Gemma 4 on vLLM.

vLLM's Triton unified attention needs 98,304 B of shared memory per block for Gemma 4's head-512
layers at its default tiles; a T4 allows 65,536 B. The fix caps the KV tile from the device's real
limit (:mod:`.smem`), ships as a vLLM plugin (:mod:`.plugin`) with a file-patch fallback
(:mod:`.filepatch`), and is proven offline by compiling vLLM's kernel for sm_75 (:mod:`.verify`).
This face imports nothing: callers import only the submodule they use. Public API, by module::


    state.status() -> TuringStatus
    verify.verify(arch="sm_75") -> VerifyReport          # .ok, .launches
    filepatch.apply_file_patch(path=None) -> FilePatchResult
    filepatch.revert_file_patch(path=None) -> FilePatchResult
    filepatch.file_patch_status(path=None) -> FilePatchStatus
    smem.needs_fix(smem_limit, capability=(7, 5), ...) -> bool
"""
