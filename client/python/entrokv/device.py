"""Statistics that stay in GPU memory, and the daemon's CUDA arena seen from a worker.

device_statistic / DeviceBuffer export a PyTorch tensor's (or a CuPy array's) CUDA allocation
as a Statistic whose source is a device_buffer (a CUDA IPC handle, an offset, the length and a
generation); Client.decide and decide_stream accept such Statistic messages where they take
arrays. map_arena maps a cuda pool's arena (PoolInfo.cuda_ipc_handle) as a torch tensor of
frames. torch and cupy are imported only when these are called: the rest of the client works
without either (docs/service.md, "Statistics in GPU memory").

The daemon reads a device buffer when the Decide call arrives, on its own CUDA context: the
values must be written before the call (synchronize the stream that wrote them; DeviceBuffer
.statistic does, unless sync=False), and must not change until the call returns."""

import ctypes
from typing import Any, Optional

from entrokv.v1 import types_pb2 as types

IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)

_DTYPES = {"float32": types.DTYPE_FLOAT32, "float16": types.DTYPE_FLOAT16,
           "bfloat16": types.DTYPE_BFLOAT16}
_KINDS = {"last_row": types.STATISTIC_KIND_LAST_ROW,
          "window_mean": types.STATISTIC_KIND_WINDOW_MEAN,
          "accumulated": types.STATISTIC_KIND_ACCUMULATED}


def _kind(kind: Optional[str]) -> int:
    kind = kind or "last_row"
    if kind not in _KINDS:
        raise ValueError(f"kind: {kind!r} is not one of {', '.join(sorted(_KINDS))}")
    return _KINDS[kind]


def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "data_ptr")


def _is_cupy(value: Any) -> bool:
    return type(value).__module__.startswith("cupy") and hasattr(value, "data")


def _libcuda():
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        raise RuntimeError(f"device_buffer: no CUDA driver (libcuda.so.1): {error}") from None


def _allocation_base(pointer: int) -> int:
    """The base of the CUDA allocation `pointer` is in (cuMemGetAddressRange)."""
    base = ctypes.c_uint64(0)
    size = ctypes.c_size_t(0)
    result = _libcuda().cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                                ctypes.c_uint64(pointer))
    if result != 0:
        raise RuntimeError(f"device_buffer: cuMemGetAddressRange failed (CUresult {result})")
    return base.value


def _ipc_handle(base: int) -> bytes:
    """The cudaIpcMemHandle_t of the allocation at `base` (cuIpcGetMemHandle), taken in the
    current context. Torch's own export (_share_cuda_) is not used: its handle's layout changes
    between releases (65 and 66 bytes have been seen) and it leaves a reference-count file."""
    handle = (ctypes.c_char * IPC_HANDLE_BYTES)()
    result = _libcuda().cuIpcGetMemHandle(ctypes.byref(handle), ctypes.c_uint64(base))
    if result != 0:
        raise RuntimeError(f"device_buffer: cuIpcGetMemHandle failed (CUresult {result}): memory "
                           "from cudaMallocAsync or PyTorch's expandable segments has no IPC "
                           "handle (set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False)")
    return bytes(handle)


class DeviceBuffer:
    """One CUDA allocation exported once (its IPC handle taken once), holding statistics.

    `source` is a CUDA torch tensor or CuPy array; every statistic sent from it is a 2-D
    contiguous [query_heads, tokens] view of memory inside the same allocation. `generation`
    is the worker's count of allocations behind this handle: bump it (a new DeviceBuffer) when
    the memory is reallocated, so that the daemon maps it again. Keep the DeviceBuffer (and the
    source) alive while the daemon may read it: a worker usually keeps one buffer of
    [layers, query_heads, max_tokens] for its whole life and sends views of it."""

    def __init__(self, source: Any, generation: int = 0):
        if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
            raise ValueError(f"generation: must be an int >= 0, got {generation!r}")
        self.generation = generation
        self._source = source  # keeps the allocation alive
        if _is_torch(source):
            if not source.is_cuda:
                raise ValueError("device_buffer: the tensor is on the CPU; send it as an array "
                                 "(data or shared_memory), or move it to a CUDA device")
            import torch  # present: source is a torch tensor
            storage = (source.untyped_storage() if hasattr(source, "untyped_storage")
                       else source.storage())  # torch < 2.0
            self.device = int(source.device.index)
            with torch.cuda.device(source.device):
                self._base = _allocation_base(int(source.data_ptr()))
                self.handle = _ipc_handle(self._base)
            self._end = storage.data_ptr() + (storage.nbytes() if hasattr(storage, "nbytes")
                                              else storage.size() * storage.element_size())
        elif _is_cupy(source):
            import cupy  # noqa: F401 -- present: source is a CuPy array
            self.device = int(source.device.id)
            with source.device:
                self._base = _allocation_base(int(source.data.ptr))
                self.handle = bytes(cupy.cuda.runtime.ipcGetMemHandle(self._base))
            self._end = int(source.data.mem.ptr) + int(source.data.mem.size)
        else:
            raise TypeError(f"device_buffer: expected a CUDA torch.Tensor or cupy.ndarray, got "
                            f"{type(source).__name__}")
        if len(self.handle) != IPC_HANDLE_BYTES:
            raise ValueError(f"device_buffer: a {len(self.handle)}-byte IPC handle")

    def statistic(self, view: Any, *, kind: Optional[str] = None,
                  sync: bool = True) -> "types.Statistic":
        """The Statistic for `view`, [query_heads, tokens] inside this buffer's allocation.
        sync: wait for the device's queued work first (the values must be written before the
        daemon reads them)."""
        shape = tuple(view.shape)
        if len(shape) != 2:
            raise ValueError(f"statistic: expected [query_heads, tokens], got shape {shape}")
        if _is_torch(view):
            if not view.is_contiguous():
                raise ValueError("statistic: the view must be contiguous (row-major)")
            name = str(view.dtype).replace("torch.", "")
            pointer, nbytes = view.data_ptr(), view.numel() * view.element_size()
        elif _is_cupy(view):
            if not view.flags.c_contiguous:
                raise ValueError("statistic: the view must be C-contiguous")
            name = str(view.dtype)
            pointer, nbytes = int(view.data.ptr), int(view.nbytes)
        else:
            raise TypeError(f"statistic: expected a torch.Tensor or cupy.ndarray view, got "
                            f"{type(view).__name__}")
        if name not in _DTYPES:
            raise ValueError(f"statistic: dtype {name} is not float32, float16 or bfloat16")
        if pointer < self._base or pointer + nbytes > self._end:
            raise ValueError("statistic: the view is not inside this DeviceBuffer's memory")
        if sync:
            if _is_torch(view):
                import torch
                torch.cuda.synchronize(view.device)
            else:
                import cupy
                cupy.cuda.get_current_stream().synchronize()
        region = types.DeviceBufferRegion(cuda_ipc_handle=self.handle,
                                          offset_bytes=pointer - self._base, length_bytes=nbytes,
                                          generation=self.generation, device=self.device)
        return types.Statistic(dtype=_DTYPES[name], query_heads=shape[0],
                               tokens=shape[1], kind=_kind(kind), device_buffer=region)


def device_statistic(array: Any, *, generation: int = 0, kind: Optional[str] = None,
                     sync: bool = True) -> "types.Statistic":
    """`array` (a CUDA torch tensor or CuPy array, [query_heads, tokens], contiguous) as a
    Statistic read from its GPU memory. Exports the allocation on every call: for repeated
    sends keep a DeviceBuffer and call its statistic()."""
    return DeviceBuffer(array, generation).statistic(array, kind=kind, sync=sync)


class _ArenaMapping:
    """A cuda arena mapped into this process; unmapped when garbage-collected."""

    def __init__(self, handle: bytes, device: int):
        import cupy
        self._runtime = cupy.cuda.runtime
        self.device = device
        with cupy.cuda.Device(device):
            self.pointer = self._runtime.ipcOpenMemHandle(
                handle, self._runtime.cudaIpcMemLazyEnablePeerAccess)

    def __del__(self):
        try:
            import cupy
            with cupy.cuda.Device(self.device):
                self._runtime.ipcCloseMemHandle(self.pointer)
        except Exception:  # noqa: BLE001 -- interpreter teardown
            pass


def map_arena(pool_info: Any, rank: int = 0, dtype: Optional[str] = None,
              device: Optional[int] = None):
    """The daemon's CUDA arena of `pool_info` (a PoolInfo of a cuda pool), rank `rank`'s, as a
    torch tensor [frames, frame_bytes] of uint8 on its device; with dtype ("float32",
    "float16", "bfloat16") a view [frames, frame_bytes / element size] of that type. Frame f of
    the block tables is row f - first_frame: the rank's RankArena.first_frame and .frames (in
    the GROUP layout a tensor-parallel rank holds its own frames only), else 0 and
    capacity_frames. Needs torch and cupy; the mapping lives as long as the tensor."""
    backend = getattr(pool_info, "backend", None)
    if backend != "cuda":
        raise ValueError(f"map_arena: pool {getattr(pool_info, 'model_id', '?')!r} has backend "
                         f"{backend!r}; only a cuda pool's arena is device memory (map a host "
                         "pool's arena_name with shared memory)")
    ranks = list(getattr(pool_info, "ranks", []) or [])
    if ranks:
        if not 0 <= rank < len(ranks):
            raise ValueError(f"rank: {rank} is outside [0, {len(ranks)})")
        handle, frame_bytes = ranks[rank].cuda_ipc_handle, ranks[rank].frame_bytes
        arena_device = ranks[rank].device if device is None else device
        frames = int(getattr(ranks[rank], "frames", 0) or pool_info.capacity_frames)
    elif rank == 0:
        handle, frame_bytes = pool_info.cuda_ipc_handle, pool_info.frame_bytes
        arena_device = 0 if device is None else device
        frames = int(pool_info.capacity_frames)
    else:
        raise ValueError(f"rank: {rank}, but the pool lists no ranks")
    handle = bytes(handle)
    if len(handle) != IPC_HANDLE_BYTES:
        raise ValueError(f"map_arena: the pool's cuda_ipc_handle is {len(handle)} bytes, "
                         f"expected {IPC_HANDLE_BYTES}")
    if frames <= 0 or frame_bytes <= 0:
        raise ValueError("map_arena: the pool has no frames")
    element = None
    if dtype is not None:
        sizes = {"float32": 4, "float16": 2, "bfloat16": 2}
        if dtype not in sizes:
            raise ValueError(f"dtype: {dtype!r} is not one of {', '.join(sizes)}")
        element = sizes[dtype]
        if frame_bytes % element:
            raise ValueError(f"dtype: frame_bytes {frame_bytes} is not a multiple of {element}")
    try:
        import cupy
        import torch
    except ImportError as error:
        raise RuntimeError(f"map_arena needs torch and cupy: {error}") from None
    mapping = _ArenaMapping(handle, arena_device)
    memory = cupy.cuda.UnownedMemory(mapping.pointer, frames * frame_bytes, mapping,
                                     device_id=arena_device)
    array = cupy.ndarray((frames, frame_bytes), dtype=cupy.uint8,
                         memptr=cupy.cuda.MemoryPointer(memory, 0))
    tensor = torch.as_tensor(array, device=f"cuda:{arena_device}")
    tensor._entrokv_arena = mapping  # the mapping lives as long as the tensor
    if element is not None:
        tensor = tensor.view(getattr(torch, dtype))
        tensor._entrokv_arena = mapping
    return tensor


__all__ = ["DeviceBuffer", "device_statistic", "map_arena", "IPC_HANDLE_BYTES"]
