// Seeded model-based test: thousands of random operations (open, fork, append, decide with
// every policy, truncate, close) against a reference model that knows nothing of frames or
// refcounts.
//
// The model names the data of every live block-table entry by a "content id": a fresh id when
// the engine writes a new page, the same id when a fork shares it, a new id on copy-on-write.
// After every operation the test checks CacheState::CheckInvariants, that used frames equal
// the number of live content ids, and that content ids and frame ids are in bijection: two
// entries share a frame exactly when the model says they share data. Each fresh frame gets its
// content's tag written into its first bytes (as a worker would), so a frame reused while
// still live, or a copy-on-write that copied the wrong bytes, shows up as a wrong tag.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/pool/cache_state.h"
#include "core/scoring/decision.h"
#include "core/scoring/policy.h"
#include "core/testing/status_matchers.h"
#include "core/util/page_count.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::entrokv::testing::IsOk;

constexpr ModelGeometry kGeometry{.layers = 3,
                                  .query_heads = 8,
                                  .kv_groups = 2,
                                  .head_dim = 2,
                                  .page_size = 4,
                                  .element_bytes = 4};
constexpr int64_t kCapacityFrames = 160;
constexpr int kOperations = 4000;

struct ModelSequence {
  int64_t length = 0;
  std::vector<std::vector<std::vector<int64_t>>> content;  // [layer][group][page], -1 evicted
};

class ReferenceModel {
 public:
  explicit ReferenceModel(FrameLayout layout)
      : unit_(layout == FrameLayout::kGroup ? 1 : kGeometry.kv_groups) {}

  std::map<std::string, ModelSequence> sequences;
  std::map<int64_t, uint64_t> tag;  // content id -> bytes the frame must start with

  int64_t Pages(int64_t tokens) const { return PageCount(tokens, kGeometry.page_size); }

  std::set<int64_t> LiveContent() const {
    std::set<int64_t> live;
    for (const auto& [id, s] : sequences)
      for (const auto& layer : s.content)
        for (const auto& group : layer)
          for (int64_t c : group)
            if (c >= 0) live.insert(c);
    return live;
  }
  int64_t References(int64_t content) const {
    int64_t n = 0;
    for (const auto& [id, s] : sequences)
      for (const auto& layer : s.content)
        for (const auto& group : layer)
          for (int64_t c : group) n += c == content;
    return n;
  }
  int64_t FreeFrames() const {
    return kCapacityFrames - static_cast<int64_t>(LiveContent().size());
  }

  // Appends to `s` (which may be a new, unlisted sequence). Returns false (and changes
  // nothing) when the frames are not there. Fills fresh / copied content ids.
  bool Append(ModelSequence& s, int64_t tokens, std::vector<int64_t>* fresh,
              std::vector<std::pair<int64_t, int64_t>>* copied) {
    struct Unit {
      int layer, first;
      enum { kFresh, kCopy, kRef } kind;
      int64_t old;
    };
    std::vector<Unit> tail;
    const int64_t old_pages = Pages(s.length);
    if (tokens > 0 && s.length % kGeometry.page_size != 0) {
      for (int l = 0; l < kGeometry.layers; ++l) {
        for (int first = 0; first < kGeometry.kv_groups; first += unit_) {
          int64_t old = -1, own = 0;
          for (int g = first; g < first + unit_; ++g) {
            const int64_t c = s.content[l][g][old_pages - 1];
            if (c >= 0) {
              old = c;
              ++own;
            }
          }
          // References() counts only listed sequences; a new sequence has no pages yet.
          if (old < 0)
            tail.push_back({l, first, Unit::kFresh, -1});
          else if (References(old) > own)
            tail.push_back({l, first, Unit::kCopy, old});
          else if (own < unit_)
            tail.push_back({l, first, Unit::kRef, old});
        }
      }
    }
    const int64_t new_pages = Pages(s.length + tokens) - old_pages;
    int64_t needed = new_pages * kGeometry.layers * (kGeometry.kv_groups / unit_);
    for (const Unit& u : tail) needed += u.kind != Unit::kRef;
    if (needed > FreeFrames()) return false;
    for (const Unit& u : tail) {
      int64_t content = u.old;
      if (u.kind == Unit::kFresh) {
        content = next_++;
        fresh->push_back(content);
      }
      if (u.kind == Unit::kCopy) {
        content = next_++;
        copied->push_back({content, u.old});
      }
      for (int g = u.first; g < u.first + unit_; ++g)
        s.content[u.layer][g][old_pages - 1] = content;
    }
    s.length += tokens;
    for (int l = 0; l < kGeometry.layers; ++l) {
      for (auto& group : s.content[l]) group.resize(Pages(s.length), -1);
      for (int first = 0; first < kGeometry.kv_groups; first += unit_) {
        for (int64_t p = old_pages; p < Pages(s.length); ++p) {
          const int64_t content = next_++;
          fresh->push_back(content);
          for (int g = first; g < first + unit_; ++g) s.content[l][g][p] = content;
        }
      }
    }
    return true;
  }

  ModelSequence Empty() const {
    ModelSequence s;
    s.content.assign(kGeometry.layers, std::vector<std::vector<int64_t>>(kGeometry.kv_groups));
    return s;
  }

 private:
  int unit_;
  int64_t next_ = 0;
};

class PoolModelTest : public ::testing::TestWithParam<FrameLayout> {
 protected:
  void SetUp() override {
    CacheOptions options;
    options.geometry = kGeometry;
    options.layout = GetParam();
    options.capacity_bytes = kCapacityFrames * FrameBytes(kGeometry, GetParam());
    options.name = "model";
    auto state = CacheState::Create(options);
    ASSERT_TRUE(state.ok()) << state.status();
    state_ = std::move(*state);
  }

  uint64_t ReadTag(FrameId frame) const {
    uint64_t value = 0;
    std::memcpy(&value, state_->FrameAddress(frame), sizeof(value));
    return value;
  }
  void WriteTag(FrameId frame, uint64_t value) {
    std::memcpy(state_->FrameAddress(frame), &value, sizeof(value));
  }

  // Compares everything; returns the content -> frame map.
  std::map<int64_t, FrameId> Compare(const ReferenceModel& model) {
    std::map<int64_t, FrameId> frame_of;
    std::map<FrameId, int64_t> content_of;
    EXPECT_THAT(state_->CheckInvariants(), IsOk());
    const std::vector<SequenceInfo> infos = state_->ListSequences(true);
    EXPECT_EQ(infos.size(), model.sequences.size());
    for (const SequenceInfo& info : infos) {
      const auto it = model.sequences.find(info.id);
      if (it == model.sequences.end()) {
        ADD_FAILURE() << "unexpected sequence " << info.id;
        continue;
      }
      EXPECT_EQ(info.length, it->second.length) << info.id;
      for (int l = 0; l < kGeometry.layers; ++l) {
        for (int g = 0; g < kGeometry.kv_groups; ++g) {
          const auto& expected = it->second.content[l][g];
          const auto& actual = info.block_tables[l][g];
          EXPECT_EQ(actual.size(), expected.size());
          for (size_t p = 0; p < std::min(actual.size(), expected.size()); ++p) {
            EXPECT_EQ(actual[p] == kNoFrame, expected[p] < 0)
                << info.id << " " << l << "," << g << "," << p;
            if (actual[p] == kNoFrame || expected[p] < 0) continue;
            auto [f, f_new] = frame_of.emplace(expected[p], actual[p]);
            EXPECT_EQ(f->second, actual[p]) << "content " << expected[p] << " in two frames";
            auto [c, c_new] = content_of.emplace(actual[p], expected[p]);
            EXPECT_EQ(c->second, expected[p]) << "frame " << actual[p] << " holds two contents";
          }
        }
      }
    }
    const PoolStats stats = state_->Stats();
    EXPECT_EQ(stats.used_frames, static_cast<int64_t>(model.LiveContent().size()));
    EXPECT_EQ(stats.used_frames + stats.free_frames, stats.capacity_frames);
    EXPECT_EQ(stats.sequences_active, static_cast<int64_t>(model.sequences.size()));
    return frame_of;
  }

  std::unique_ptr<CacheState> state_;
};

TEST_P(PoolModelTest, RandomOperationsMatchTheReferenceModel) {
  uint32_t seed = 20240611;
  if (const char* env = std::getenv("ENTROKV_SEED"))
    seed = static_cast<uint32_t>(std::strtoul(env, nullptr, 10));
  std::printf("PoolModelTest seed=%u (set ENTROKV_SEED to replay)\n", seed);
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  std::mt19937 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };

  ReferenceModel model(GetParam());
  const std::vector<absl::string_view> policies = PolicyNames();
  ASSERT_FALSE(policies.empty());
  std::map<std::string, int> decisions_per_policy;
  int exhausted = 0, copies = 0, truncations = 0;

  for (int op = 0; op < kOperations && !HasFailure(); ++op) {
    SCOPED_TRACE(absl::StrCat("operation ", op));
    const std::string id = absl::StrCat("s", uniform(0, 9));
    const bool exists = model.sequences.contains(id);
    std::vector<int64_t> fresh;
    std::vector<std::pair<int64_t, int64_t>> copied;
    const int64_t kind = uniform(0, 99);
    if (kind < 15) {  // open
      const int64_t tokens = uniform(0, 24);
      const absl::Status status = state_->OpenSequence(id, tokens);
      if (exists) {
        EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists);
      } else {
        ModelSequence s = model.Empty();
        if (model.Append(s, tokens, &fresh, &copied)) {
          ASSERT_THAT(status, IsOk());
          model.sequences[id] = std::move(s);
        } else {
          EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
          ++exhausted;
        }
      }
    } else if (kind < 25) {  // fork
      const std::string parent = absl::StrCat("s", uniform(0, 9));
      const auto p = model.sequences.find(parent);
      const int64_t parent_pages = p == model.sequences.end() ? 0 : model.Pages(p->second.length);
      const int64_t prefix = uniform(0, parent_pages + 1);
      const absl::Status status = state_->ForkSequence(id, parent, prefix);
      if (exists) {
        EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists) << status;
      } else if (p == model.sequences.end()) {
        EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
      } else if (prefix > parent_pages) {
        EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange) << status;
      } else {
        ASSERT_THAT(status, IsOk());
        ModelSequence child = model.Empty();
        child.length = std::min(p->second.length, prefix * kGeometry.page_size);
        for (int l = 0; l < kGeometry.layers; ++l)
          for (int g = 0; g < kGeometry.kv_groups; ++g) {
            const auto& src = p->second.content[l][g];
            child.content[l][g].assign(src.begin(), src.begin() + prefix);
          }
        model.sequences[id] = std::move(child);
      }
    } else if (kind < 55) {  // append
      const int64_t tokens = uniform(0, 9);
      const auto result = state_->AppendTokens(id, tokens);
      if (!exists) {
        EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
      } else {
        ModelSequence s = model.sequences[id];
        if (model.Append(s, tokens, &fresh, &copied)) {
          ASSERT_THAT(result.status(), IsOk());
          EXPECT_EQ(result->length, s.length);
          EXPECT_EQ(result->frames_copied, static_cast<int64_t>(copied.size()));
          model.sequences[id] = std::move(s);
        } else {
          EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted)
              << result.status();
          ++exhausted;
        }
      }
    } else if (kind < 88) {  // decide with a random policy on a random statistic
      const auto it = model.sequences.find(id);
      const int64_t length = exists ? it->second.length : uniform(1, 20);
      const int32_t layer = static_cast<int32_t>(uniform(0, kGeometry.layers - 1));
      const absl::string_view policy_name = policies[uniform(0, policies.size() - 1)];
      std::vector<std::vector<int32_t>> kept(kGeometry.kv_groups);
      if (length > 0) {
        std::vector<float> statistic(static_cast<size_t>(kGeometry.query_heads) * length);
        for (float& v : statistic) v = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
        const Policy* policy = *FindPolicy(policy_name);
        PolicyOptions options;
        options.page_size = kGeometry.page_size;
        LayerRequest request =
            LayerRequestFor(*StatisticView::Create(statistic.data(), DType::kFloat32,
                                                   kGeometry.query_heads, length),
                            kGeometry.query_heads, kGeometry.kv_groups, length,
                            uniform(1, model.Pages(length) + 1));
        request.measure = false;
        auto decision = DecideLayer(*policy, options, request);
        ASSERT_TRUE(decision.ok()) << policy_name << ": " << decision.status();
        for (int g = 0; g < kGeometry.kv_groups; ++g) kept[g] = decision->groups[g].kept_pages;
      }
      const bool stale = uniform(0, 19) == 0;  // a decision for another length
      const auto result = state_->ApplyDecision(id, layer, length + (stale ? 1 : 0), kept);
      if (!exists) {
        EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
      } else if (stale) {
        EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
      } else {
        ASSERT_THAT(result.status(), IsOk());
        ++decisions_per_policy[std::string(policy_name)];
        const std::set<int64_t> before = model.LiveContent();
        ModelSequence& s = it->second;
        for (int g = 0; g < kGeometry.kv_groups; ++g) {
          const std::set<int32_t> keep(kept[g].begin(), kept[g].end());
          std::vector<int64_t> evicted;
          for (int64_t p = 0; p < model.Pages(length); ++p) {
            if (!keep.contains(static_cast<int32_t>(p)) && s.content[layer][g][p] >= 0) {
              s.content[layer][g][p] = -1;
              evicted.push_back(p);
            }
          }
          EXPECT_EQ(result->evicted_pages_per_group[g], evicted);
        }
        const int64_t freed = static_cast<int64_t>(before.size() - model.LiveContent().size());
        EXPECT_EQ(result->frames_released, freed);
      }
    } else if (kind < 94) {  // truncate (rejected speculative tokens), sometimes too many
      const auto it = model.sequences.find(id);
      const int64_t length = exists ? it->second.length : 0;
      const int64_t tokens = uniform(0, length + 1);
      const auto result = state_->TruncateSequence(id, tokens);
      if (!exists) {
        EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
      } else if (tokens < 1) {
        EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
      } else if (tokens > length) {
        EXPECT_EQ(result.status().code(), absl::StatusCode::kOutOfRange);
      } else {
        ASSERT_THAT(result.status(), IsOk());
        ++truncations;
        const std::set<int64_t> before = model.LiveContent();
        ModelSequence& s = it->second;
        s.length -= tokens;
        for (auto& layer : s.content) {
          for (auto& group : layer) group.resize(model.Pages(s.length));
        }
        EXPECT_EQ(result->length, s.length);
        EXPECT_EQ(static_cast<int64_t>(result->freed_frames.size()),
                  static_cast<int64_t>(before.size() - model.LiveContent().size()));
      }
    } else {  // close
      const absl::Status status = state_->CloseSequence(id);
      if (!exists) {
        EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
      } else {
        ASSERT_THAT(status, IsOk());
        model.sequences.erase(id);
      }
    }

    const std::map<int64_t, FrameId> frame_of = Compare(model);
    for (const int64_t content : fresh) {
      if (!frame_of.contains(content)) continue;  // e.g. evicted since: never
      model.tag[content] = 0x1000000ull + content;
      WriteTag(frame_of.at(content), model.tag[content]);
    }
    for (const auto& [content, source] : copied) {
      model.tag[content] = model.tag[source];
      ++copies;
    }
    for (const auto& [content, frame] : frame_of) {
      ASSERT_EQ(ReadTag(frame), model.tag[content]) << "frame " << frame << " content " << content;
    }
  }
  for (const absl::string_view name : policies) {
    EXPECT_GT(decisions_per_policy[std::string(name)], 0) << name << " never decided";
  }
  EXPECT_GT(exhausted, 0) << "the pool never filled: the test does not reach exhaustion";
  EXPECT_GT(truncations, 0) << "no truncation exercised";
  if (GetParam() == FrameLayout::kGroup) {
    EXPECT_GT(copies, 0) << "no copy-on-write exercised";
  }

  for (const auto& [id, s] : std::map<std::string, ModelSequence>(model.sequences)) {
    ASSERT_THAT(state_->CloseSequence(id), IsOk());
  }
  EXPECT_EQ(state_->Stats().used_frames, 0);
  EXPECT_THAT(state_->CheckInvariants(), IsOk());
  std::printf("decisions=%zu policies, exhausted=%d, copies=%d, truncations=%d\n",
              decisions_per_policy.size(), exhausted, copies, truncations);
}

INSTANTIATE_TEST_SUITE_P(Layouts, PoolModelTest,
                         ::testing::Values(FrameLayout::kGroup, FrameLayout::kLayer),
                         [](const ::testing::TestParamInfo<FrameLayout>& info) {
                           return std::string(FrameLayoutName(info.param));
                         });

}  // namespace
}  // namespace entrokv
