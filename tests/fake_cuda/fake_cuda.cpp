// Fake CUDA for a CPU build of torch: the fake-CUDA lane's C++ part (tests/fake_cuda/lane.py builds and loads it).
//
// A CPU build of torch has no CUDA hooks and no device guard for the CUDA device type, so a FakeTensor on device
// "cuda" that autograd touches (a requires_grad leaf, an optimizer state) aborts with "not linked with support for
// cuda devices". Two registrations, made when this library is loaded (before `import torch`, with RTLD_GLOBAL, so
// that ATen's registries are the ones torch then uses):
//
//  * ATen's CUDA hooks (`at::CUDAHooksInterface`, registered as "CUDAHooks", the name ATen looks up once at its
//    first use): CUDA built and available, one device, the CPU generator as the device's generators, and a pinned
//    allocator that is the CPU's malloc with its pointers remembered (so `is_pinned()` answers true for them).
//  * c10's device guard for the CUDA device type: torch's own `c10::impl::FakeGuardImpl` (device 0 of 1, streams and
//    events as no-ops).
//
// No kernel runs on "cuda": every CUDA tensor must be a FakeTensor (lane.py's FakeTensorMode). Pinned to the torch
// build lane.py names (private interfaces: their virtual tables change between releases).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_set>

namespace distnerf_fake_cuda {

std::mutex pinned_mutex;
std::unordered_set<const void*>& pinned_ptrs() {
  static auto* ptrs = new std::unordered_set<const void*>();
  return *ptrs;
}

void pinned_free(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(pinned_mutex);
    pinned_ptrs().erase(ptr);
  }
  std::free(ptr);
}

// "Pinned" host memory: malloc'd CPU memory whose pointers are remembered for isPinnedPtr.
struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* ptr = std::malloc(n == 0 ? 1 : n);
    TORCH_CHECK(ptr != nullptr, "fake_cuda: pinned allocation of ", n, " bytes failed");
    {
      std::lock_guard<std::mutex> lock(pinned_mutex);
      pinned_ptrs().insert(ptr);
    }
    return {ptr, ptr, &pinned_free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &pinned_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

PinnedAllocator pinned_allocator;

struct FakeCUDAHooks final : at::CUDAHooksInterface {
  explicit FakeCUDAHooks(at::CUDAHooksArgs) {}
  void init() const override {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasCUDA() const override { return true; }
  bool hasCUDART() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  int getNumGPUs() const override { return 1; }
  c10::DeviceIndex current_device() const override { return 0; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  void setCurrentDevice(c10::DeviceIndex) const override {}
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex) const override { return 0; }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex) const override { return 0; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Generator getNewGenerator(c10::DeviceIndex) const override { return at::detail::createCPUGenerator(); }
  bool isPinnedPtr(const void* data) const override {
    std::lock_guard<std::mutex> lock(pinned_mutex);
    return pinned_ptrs().count(data) > 0;
  }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator; }
  c10::Device getDeviceFromPtr(void*) const override { return c10::Device(c10::DeviceType::CUDA, 0); }
  void deviceSynchronize(c10::DeviceIndex) const override {}
};

}  // namespace distnerf_fake_cuda

namespace at {
C10_REGISTER_TYPED_CLASS(CUDAHooksRegistry, "CUDAHooks", distnerf_fake_cuda::FakeCUDAHooks)
}  // namespace at
C10_REGISTER_GUARD_IMPL(CUDA, c10::impl::FakeGuardImpl<c10::DeviceType::CUDA>)

// A symbol lane.py checks after loading (the library it loaded is this one).
extern "C" int distnerf_fake_cuda_version() { return 1; }
