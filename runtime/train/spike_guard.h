// The loss-spike guard, training.skip_spikes (llm.c's outlier detector, llmc/outlier_detector.h):
// a step whose global loss or gradient norm lies more than `threshold` standard deviations above
// the mean of the last `window` steps that updated is skipped, with no update, as an fp16 overflow
// is (the LR schedule does not advance). Until `window` steps have updated it judges nothing.
// A skipped step's values stay out of the window, so one spike does not widen it for the next.
// Every rank sees the same global loss and norm, so every rank decides the same.
// The windows and the count go into a checkpoint's manifest ("spike_guard"), so a resume judges
// as the uninterrupted run.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include <nlohmann/json.hpp>

namespace ds::rt::train {

class SpikeGuard {
 public:
  SpikeGuard(double threshold, int window) : threshold_(threshold), window_(window) {}

  // Empty when the step may update (its values then join the windows; non-finite values, an fp16
  // overflow's, are left to the loss scaler); otherwise why it is skipped ("loss 9.8100 is 14.2
  // standard deviations above the mean 3.1100 of the last 16 steps").
  std::string judge(double loss, double grad_norm);
  int64_t skipped() const { return skipped_; }

  nlohmann::json state() const;
  // Throws invalid_argument naming `where` for a state of another window size or malformed.
  void restore(const nlohmann::json& j, const std::string& where);

 private:
  // How many standard deviations `x` lies above the window's mean (population deviation); 0 while
  // the window is not full or has no spread.
  double z(const std::deque<double>& w, double x) const;

  double threshold_;
  int window_;
  std::deque<double> loss_, norm_;
  int64_t skipped_ = 0;
};

}  // namespace ds::rt::train
