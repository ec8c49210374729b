// A worker outside the tree: checks entrokvd's readiness, registers a model and reads its pool
// back through the installed entrokv::client. Usage: consumer HOST:PORT. Exit 0 when every call
// answered as expected; otherwise the first wrong answer on stderr and exit 1.
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "client/cpp/client.h"

namespace {

int Fail(const std::string& what) {
  std::cerr << "consumer: " << what << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return Fail("usage: consumer HOST:PORT");
  entrokv::ClientOptions options;
  options.target = argv[1];
  entrokv::Client client(options);

  // The daemon may still be starting: wait (up to 30 s) for readiness, as a worker would.
  absl::StatusOr<std::string> health;
  for (int attempt = 0; attempt < 300; ++attempt) {
    health = client.Health();
    if (health.ok() && *health == "SERVING") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!health.ok()) return Fail("Health: " + health.status().ToString());
  if (*health != "SERVING") return Fail("Health: " + *health + ", expected SERVING");

  entrokv::v1::RegisterModelRequest model;
  model.set_model_id("consumer");
  entrokv::v1::ModelGeometry* geometry = model.mutable_geometry();
  geometry->set_layers(2);
  geometry->set_query_heads(4);
  geometry->set_kv_groups(2);
  geometry->set_head_dim(8);
  geometry->set_page_size(16);
  geometry->set_element_bytes(2);
  model.set_capacity_bytes(1 << 20);
  const absl::StatusOr<entrokv::v1::RegisterModelResponse> registered = client.RegisterModel(model);
  if (!registered.ok()) return Fail("RegisterModel: " + registered.status().ToString());

  entrokv::v1::GetPoolStatsRequest request;
  request.set_model_id("consumer");
  const absl::StatusOr<entrokv::v1::PoolStats> stats = client.GetPoolStats(request);
  if (!stats.ok()) return Fail("GetPoolStats: " + stats.status().ToString());
  if (stats->capacity_frames() <= 0 || stats->free_frames() != stats->capacity_frames()) {
    return Fail("GetPoolStats: " + stats->ShortDebugString() +
                ", expected a pool with every frame free");
  }
  std::cout << "consumer: " << *health << ", model consumer: " << stats->free_frames() << " of "
            << stats->capacity_frames() << " frames free\n";
  return EXIT_SUCCESS;
}
