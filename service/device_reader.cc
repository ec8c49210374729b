#include "service/device_reader.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/cuda/memory.h"  // kIpcHandleBytes: plain C++, in every build
#include "core/util/status_macros.h"
#ifdef ENTROKV_HAVE_CUDA
#include "core/cuda/ipc.h"
#endif

namespace entrokv::service {
namespace {

#ifdef ENTROKV_HAVE_CUDA
class CudaMemory final : public DeviceMemory {
 public:
  absl::StatusOr<Mapping> Open(absl::string_view field, absl::string_view handle,
                               int device) override {
    ASSIGN_OR_RETURN(const cuda::IpcMapping mapped, cuda::OpenIpcHandle(field, handle, device));
    return Mapping{.device = mapped.device, .base = mapped.base, .bytes = mapped.bytes};
  }
  void Close(const Mapping& mapping) override {
    cuda::CloseIpcHandle(cuda::IpcMapping{
        .device = mapping.device, .base = const_cast<void*>(mapping.base), .bytes = mapping.bytes});
  }
  absl::Status CopyToHost(absl::string_view field, const Mapping& mapping, uint64_t offset,
                          uint64_t length, char* out) override {
    return cuda::CopyDeviceToHost(field, mapping.device, out,
                                  static_cast<const char*>(mapping.base) + offset, length);
  }
};
#else
class CudaMemory final : public DeviceMemory {
 public:
  absl::StatusOr<Mapping> Open(absl::string_view field, absl::string_view, int) override {
    return absl::FailedPreconditionError(
        absl::StrCat(field,
                     ": this entrokvd was built without CUDA and cannot map device "
                     "memory; send the statistic as data or shared_memory"));
  }
  void Close(const Mapping&) override {}
  absl::Status CopyToHost(absl::string_view field, const Mapping&, uint64_t, uint64_t,
                          char*) override {
    return absl::FailedPreconditionError(absl::StrCat(field, ": built without CUDA"));
  }
};
#endif

}  // namespace

std::unique_ptr<DeviceMemory> CudaDeviceMemory() { return std::make_unique<CudaMemory>(); }

absl::Status CheckDeviceRegion(absl::string_view field, const v1::DeviceBufferRegion& region,
                               uint64_t expected, int element_bytes) {
  if (region.cuda_ipc_handle().size() != static_cast<size_t>(cuda::kIpcHandleBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".cuda_ipc_handle: ", region.cuda_ipc_handle().size(),
                     " bytes, a cudaIpcMemHandle_t is ", cuda::kIpcHandleBytes));
  }
  if (region.length_bytes() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".length_bytes: ", region.length_bytes(), ", expected ", expected));
  }
  if (element_bytes <= 0 || region.offset_bytes() % static_cast<uint64_t>(element_bytes) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".offset_bytes: ", region.offset_bytes(), " is not element-aligned"));
  }
  if (region.offset_bytes() > UINT64_MAX - region.length_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".offset_bytes: ", region.offset_bytes(), " + length_bytes overflows"));
  }
  if (region.device() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".device: ", region.device(), " is negative"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceStatistic> DeviceReader::Acquire(absl::string_view field,
                                                      const v1::DeviceBufferRegion& region,
                                                      uint64_t expected, int element_bytes,
                                                      absl::string_view model_id,
                                                      absl::string_view sequence_id) {
  RETURN_IF_ERROR(CheckDeviceRegion(field, region, expected, element_bytes));
  const std::string& key = region.cuda_ipc_handle();
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it != entries_.end() && region.generation() < it->second.generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ".generation: ", region.generation(), " is older than generation ",
        it->second.generation, " this handle is mapped at; a worker's generation only grows"));
  }
  if (it != entries_.end() && (region.generation() > it->second.generation ||
                               region.device() != it->second.mapping->mapping().device)) {
    // The worker reallocated: the old mapping goes (a decision still reading it keeps it
    // until it is done), and the handle is mapped anew below.
    entries_.erase(it);
    it = entries_.end();
  }
  if (it == entries_.end()) {
    ASSIGN_OR_RETURN(const DeviceMemory::Mapping mapped,
                     memory_->Open(absl::StrCat(field, ".cuda_ipc_handle"), key, region.device()));
    Entry entry;
    entry.generation = region.generation();
    entry.mapping = std::make_shared<const DeviceMapping>(memory_, mapped);
    it = entries_.emplace(key, std::move(entry)).first;
  }
  Entry& entry = it->second;
  entry.last_used = ++clock_;
  const uint64_t size = entry.mapping->mapping().bytes;
  if (region.offset_bytes() > size || region.length_bytes() > size - region.offset_bytes()) {
    const absl::Status outside = absl::InvalidArgumentError(absl::StrCat(
        field, ".offset_bytes: [", region.offset_bytes(), ", ", region.offset_bytes(), " + ",
        region.length_bytes(), ") is outside the allocation of ", size, " bytes"));
    TrimLocked();  // a mapping made for this request alone goes again
    return outside;
  }
  const std::pair<std::string, std::string> owner(model_id, sequence_id);
  if (std::find(entry.owners.begin(), entry.owners.end(), owner) == entry.owners.end()) {
    entry.owners.push_back(owner);
  }
  DeviceStatistic statistic(entry.mapping, std::string(field), region.offset_bytes(),
                            region.length_bytes());
  TrimLocked();
  return statistic;
}

void DeviceReader::TrimLocked() {
  absl::erase_if(entries_, [](const auto& item) { return item.second.owners.empty(); });
  while (entries_.size() > static_cast<size_t>(max_mappings_)) {
    auto oldest = entries_.begin();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->second.last_used < oldest->second.last_used) oldest = it;
    }
    entries_.erase(oldest);
  }
}

void DeviceReader::ReleaseSequence(absl::string_view model_id, absl::string_view sequence_id) {
  absl::MutexLock lock(&mu_);
  for (auto& [key, entry] : entries_) {
    std::erase_if(entry.owners, [&](const auto& owner) {
      return owner.first == model_id && owner.second == sequence_id;
    });
  }
  TrimLocked();
}

void DeviceReader::ReleaseModel(absl::string_view model_id) {
  absl::MutexLock lock(&mu_);
  for (auto& [key, entry] : entries_) {
    std::erase_if(entry.owners, [&](const auto& owner) { return owner.first == model_id; });
  }
  TrimLocked();
}

int DeviceReader::mapped() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(entries_.size());
}

}  // namespace entrokv::service
