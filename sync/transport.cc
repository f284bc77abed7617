#include "sync/transport.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "core/excerpt.h"
#include "core/numbers.h"

namespace bagpipe {

void Mailbox::Deliver(Message message, absl::Time deliver_at) {
  absl::MutexLock lock(&mu_);
  queues_[{message.source, message.tag}].push_back({std::move(message), deliver_at, next_seq_++});
  cv_.SignalAll();
}

void Mailbox::Poison(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (poisoned_.ok()) poisoned_ = why;
  cv_.SignalAll();
}

void Mailbox::MarkGone(int source, std::string why) {
  absl::MutexLock lock(&mu_);
  gone_.emplace(source, std::move(why));
  cv_.SignalAll();
}

std::vector<int> Mailbox::SourcesWithPending(int tag) {
  std::vector<int> sources;
  absl::MutexLock lock(&mu_);
  for (const auto& [key, queue] : queues_) {
    if (key.second == tag && !queue.empty()) sources.push_back(key.first);
  }
  std::sort(sources.begin(), sources.end());
  return sources;
}

absl::StatusOr<Message> Mailbox::Receive(int source, int tag, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (true) {
    if (!poisoned_.ok()) return poisoned_;
    const absl::Time now = absl::Now();
    // The deliverable message that arrived first among the matching queues (FIFO per sender;
    // across senders, earliest delivery time first).
    std::deque<Pending>* best = nullptr;
    absl::Time next_delivery = absl::InfiniteFuture();
    auto consider = [&](std::deque<Pending>& queue) {
      if (queue.empty()) return;
      const absl::Time at = queue.front().deliver_at;
      if (at <= now) {
        // Earliest delivery first; among equals, the order of arrival (MPI's non-overtaking
        // rule: a wildcard receive sees one sender's messages in the order they were sent).
        if (best == nullptr || at < best->front().deliver_at ||
            (at == best->front().deliver_at && queue.front().seq < best->front().seq)) {
          best = &queue;
        }
      } else {
        next_delivery = std::min(next_delivery, at);
      }
    };
    if (source == kAnySource || tag == kAnyTag) {
      for (auto& [key, queue] : queues_) {
        if ((source == kAnySource || key.first == source) &&
            (tag == kAnyTag || key.second == tag)) {
          consider(queue);
        }
      }
    } else if (auto it = queues_.find({source, tag}); it != queues_.end()) {
      consider(it->second);
    }
    if (best != nullptr) {
      Message message = std::move(best->front().message);
      best->pop_front();
      return message;
    }
    if (source != kAnySource && next_delivery == absl::InfiniteFuture()) {
      if (auto gone = gone_.find(source); gone != gone_.end()) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "rank %d waits for a message (%s) from rank %d, which ended its part of the job "
            "without sending it: %s",
            rank_, tag == kAnyTag ? std::string("any tag") : absl::StrCat("tag ", tag), source,
            gone->second));
      }
    }
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "rank %d waited %s for a message (%s) from %s and none came; that peer may have "
          "died or hung",
          rank_, absl::FormatDuration(timeout),
          tag == kAnyTag ? std::string("any tag") : absl::StrCat("tag ", tag),
          source == kAnySource ? std::string("any rank") : absl::StrCat("rank ", source)));
    }
    // Wake at the next delivery time or the deadline, or when a message or poison arrives.
    const absl::Time wake = std::min(deadline, next_delivery);
    cv_.WaitWithDeadline(&mu_, wake);
  }
}

absl::StatusOr<LinkModel> LinkModel::Parse(const std::string& text) {
  LinkModel link;
  const std::string lowered = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (lowered.empty() || lowered == "none") return link;
  // Spaces around the parts are allowed: ToString ("1 Gbit/s, 200us") must parse back.
  std::vector<std::string> parts = absl::StrSplit(lowered, ',');
  for (std::string& part : parts) absl::StripAsciiWhitespace(&part);
  if (parts.size() > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--server-link '", Excerpt(text), "': expected BANDWIDTH[,LATENCY], e.g. 25Gbit/s,20us"));
  }
  // Bandwidth: a number with a unit among bit/s, kbit/s, mbit/s, gbit/s, b/s, kb/s, mb/s, gb/s.
  struct Unit {
    const char* suffix;
    double bytes_per_second;
  };
  static constexpr Unit kUnits[] = {{"gbit/s", 1e9 / 8}, {"mbit/s", 1e6 / 8}, {"kbit/s", 1e3 / 8},
                                    {"bit/s", 1.0 / 8},  {"gb/s", 1e9},       {"mb/s", 1e6},
                                    {"kb/s", 1e3},       {"b/s", 1.0}};
  bool parsed = false;
  for (const Unit& unit : kUnits) {
    if (absl::EndsWith(parts[0], unit.suffix)) {
      double value = 0;
      const std::string number = parts[0].substr(0, parts[0].size() - strlen(unit.suffix));
      // Every message's transfer time is computed from it, and ToString scales it: from 1 bit/s
      // (a denormal one gives infinite transfer times) to 1e9 Gbit/s ("inf" and "3e307B/s"
      // overflow).
      if (!ParseDecimalDouble(number, &value)) break;
      link.bytes_per_second = value * unit.bytes_per_second;
      if (!(link.bytes_per_second >= 1.0 / 8 && link.bytes_per_second <= 1e18 / 8)) break;
      parsed = true;
      break;
    }
  }
  if (!parsed) {
    return absl::InvalidArgumentError(
        absl::StrCat("--server-link '", Excerpt(text),
                     "': bandwidth must be a number from 1bit/s to 1e9Gbit/s with a unit (Gbit/s, "
                     "Mbit/s, GB/s, MB/s, ...)"));
  }
  if (parts.size() == 2) {
    absl::Duration latency;
    // absl::ParseDuration accepts "inf": a message would then never be delivered.
    if (!absl::ParseDuration(parts[1], &latency) || latency < absl::ZeroDuration() ||
        latency == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--server-link '", Excerpt(text),
                       "': latency must be a finite duration like 20us or 1ms"));
    }
    link.latency = latency;
  }
  return link;
}

std::string LinkModel::ToString() const {
  if (!enabled()) return "none";
  return absl::StrFormat("%.3g Gbit/s, %s", bytes_per_second * 8 / 1e9,
                         absl::FormatDuration(latency));
}

class InProcessHub::Endpoint final : public Transport {
 public:
  Endpoint(InProcessHub* hub, int rank) : hub_(hub), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }

  absl::Status Send(int destination, int tag, Bytes payload) override {
    if (destination < 0 || destination >= hub_->size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank_, " sent to rank ", destination, " of ", hub_->size()));
    }
    if (absl::Status status = aborted(); !status.ok()) return status;
    const absl::Time at = hub_->DeliveryTime(rank_, destination, payload.size());
    hub_->mailboxes_[destination]->Deliver(Message{rank_, tag, std::move(payload)}, at);
    return absl::OkStatus();
  }

  absl::StatusOr<Message> Receive(int source, int tag, absl::Duration timeout) override {
    return hub_->mailboxes_[rank_]->Receive(source, tag, timeout);
  }
  std::vector<int> SourcesWithPending(int tag) override {
    return hub_->mailboxes_[rank_]->SourcesWithPending(tag);
  }

  void Abort(const absl::Status& why) override { hub_->AbortAll(why); }
  absl::Status aborted() const override {
    absl::MutexLock lock(&hub_->mu_);
    return hub_->aborted_;
  }

 private:
  InProcessHub* hub_;
  int rank_;
};

InProcessHub::InProcessHub(int size, LinkModel link, std::vector<int> emulated)
    : link_(link), emulated_(size, false) {
  for (int r = 0; r < size; ++r) {
    endpoints_.push_back(std::make_unique<Endpoint>(this, r));
    mailboxes_.push_back(std::make_unique<Mailbox>(r));
  }
  for (int r : emulated) {
    if (r >= 0 && r < size) emulated_[r] = true;
  }
}

InProcessHub::~InProcessHub() = default;

Transport& InProcessHub::endpoint(int rank) { return *endpoints_[rank]; }

absl::Time InProcessHub::DeliveryTime(int source, int destination, size_t bytes) {
  if (!link_.enabled() || !(emulated_[source] || emulated_[destination])) {
    return absl::InfinitePast();
  }
  const absl::Time now = absl::Now();
  const absl::Duration transfer =
      link_.bytes_per_second > 0
          ? absl::Seconds(static_cast<double>(bytes) / link_.bytes_per_second)
          : absl::ZeroDuration();
  absl::MutexLock lock(&mu_);
  absl::Time& free_at = link_free_at_[{source, destination}];
  const absl::Time start = std::max(now, free_at);
  free_at = start + transfer;
  return free_at + link_.latency;
}

void InProcessHub::AbortAll(const absl::Status& why) {
  {
    absl::MutexLock lock(&mu_);
    if (!aborted_.ok()) return;
    aborted_ = why;
  }
  for (auto& mailbox : mailboxes_) mailbox->Poison(why);
}

}  // namespace bagpipe
