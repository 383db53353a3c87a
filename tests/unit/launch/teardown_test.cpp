// The teardown state machine (launch/teardown.h), transition by transition, with time passed in:
// a rank's failure (the grace, the stop, the kill timeout), ranks ending cleanly, a rank killed by
// a signal, a rank that cannot start, signals (the interruption, a second SIGINT, a repeated
// SIGTERM, the preemption signal), the controller's stop and its end of input, a lost or silent
// node, the launcher closing; then the job's end from the outcome: restart_after and the summary
// finish() prints for it.
#include "launch/teardown.h"

#include <signal.h>
#include <unistd.h>

#include <string>

#include <gtest/gtest.h>

#include "common/preemption.h"
#include "launch/output.h"

namespace ds::launch {
namespace {

using namespace std::chrono_literals;
using Phase = TeardownPhase;

const Teardown::TimePoint t0{};  // every test's clock starts here

TeardownPolicy policy(Millis grace = 5000ms, Millis kill = 10000ms, int preempt_signal = 0) {
  return TeardownPolicy{grace, kill, preempt_signal};
}

ExitStatus exit_code(int code) {
  ExitStatus s;
  s.code = code;
  return s;
}
ExitStatus killed_by(int sig) {
  ExitStatus s;
  s.signal = sig;
  return s;
}

TeardownOrders end_rank(Teardown& t, int rank, const ExitStatus& status, size_t others_running,
                        Millis at = 0ms) {
  return t.rank_ended(WorkerExit{rank, status}, "node-a", others_running, t0 + at);
}

// Nothing asked of the driver.
void expect_nothing(const TeardownOrders& o) {
  EXPECT_FALSE(o.any()) << "kill_group " << o.kill_group << " grace_begins " << o.grace_begins
                        << " grace_over " << o.grace_over << " interrupted " << o.interrupted
                        << " stop " << o.stop << " force " << static_cast<int>(o.force);
}

// ---------------------------------------------------------------- ranks ending

TEST(Teardown, RanksExitingZeroWhileOthersRunChangeNothingAndTheGenerationSucceeds) {
  Teardown t(policy());
  expect_nothing(end_rank(t, 2, exit_code(0), 2));
  expect_nothing(t.tick(t0 + 1h));
  expect_nothing(end_rank(t, 0, exit_code(0), 1));
  EXPECT_EQ(t.phase(), Phase::kRunning);
  EXPECT_FALSE(t.next_deadline());
  expect_nothing(end_rank(t, 1, exit_code(0), 0));
  EXPECT_EQ(t.phase(), Phase::kRunning);
  GenerationResult r = t.generation_result();
  EXPECT_TRUE(r.ok());
  ASSERT_EQ(r.exits.size(), 3u);
  EXPECT_EQ(r.exits[0].rank, 2);
  EXPECT_EQ(r.exits[1].rank, 0);
  EXPECT_EQ(r.exits[2].rank, 1);
  EXPECT_FALSE(t.first_failure());
}

TEST(Teardown, ANonZeroExitGivesTheOthersTheGraceThenSigtermThenSigkill) {
  Teardown t(policy(5000ms, 10000ms));
  TeardownOrders failed = end_rank(t, 1, exit_code(3), 3, 100ms);
  EXPECT_TRUE(failed.kill_group);  // what the failed rank left in its group
  EXPECT_TRUE(failed.grace_begins);
  EXPECT_EQ(failed.stop, 0);
  EXPECT_EQ(t.phase(), Phase::kFailureGrace);
  EXPECT_EQ(t.next_deadline(), t0 + 5100ms);

  expect_nothing(t.tick(t0 + 5099ms));
  TeardownOrders grace_over = t.tick(t0 + 5100ms);
  EXPECT_TRUE(grace_over.grace_over);
  EXPECT_EQ(grace_over.stop, SIGTERM);
  EXPECT_EQ(grace_over.force, Force::kNone);
  EXPECT_EQ(t.phase(), Phase::kStopping);
  EXPECT_EQ(t.next_deadline(), t0 + 15100ms);

  expect_nothing(t.tick(t0 + 15099ms));
  TeardownOrders killed = t.tick(t0 + 15100ms);
  EXPECT_EQ(killed.force, Force::kKillTimeout);
  EXPECT_EQ(killed.stop, 0);
  EXPECT_EQ(t.phase(), Phase::kForced);
  EXPECT_FALSE(t.next_deadline());
  expect_nothing(t.tick(t0 + 1h));

  // The survivors die of the teardown: consequences, not failures.
  EXPECT_TRUE(end_rank(t, 0, killed_by(SIGTERM), 2, 16s).kill_group);
  EXPECT_TRUE(end_rank(t, 2, killed_by(SIGKILL), 1, 16s).kill_group);
  EXPECT_TRUE(end_rank(t, 3, exit_code(0), 0, 16s).kill_group);

  GenerationResult r = t.generation_result();
  EXPECT_FALSE(r.ok());
  ASSERT_TRUE(r.first_failure);
  EXPECT_EQ(r.first_failure->rank, 1);
  EXPECT_EQ(r.first_failure->status.code, 3);
  EXPECT_EQ(r.stop_signal, 0);
  EXPECT_FALSE(r.stopped_by_controller);
  EXPECT_EQ(r.exits.size(), 4u);
  ASSERT_TRUE(t.first_failure());
  EXPECT_EQ(t.first_failure()->host, "node-a");
  EXPECT_EQ(describe_failure(*t.first_failure()), "rank 1 on node-a exited with exit code 3");
}

TEST(Teardown, RanksEndingOnTheirOwnInTheGraceChangeNothingAndLaterFailuresNeverReplaceTheFirst) {
  Teardown t(policy());
  end_rank(t, 1, exit_code(3), 3);
  // A survivor that names the dead peer and exits 1, one that exits 0: the grace goes on.
  TeardownOrders peer = end_rank(t, 0, exit_code(1), 2, 1s);
  EXPECT_TRUE(peer.kill_group);
  EXPECT_FALSE(peer.grace_begins);
  EXPECT_EQ(peer.stop, 0);
  expect_nothing(end_rank(t, 2, exit_code(0), 1, 2s));
  EXPECT_EQ(t.phase(), Phase::kFailureGrace);
  EXPECT_EQ(t.next_deadline(), t0 + 5s);
  ASSERT_TRUE(t.first_failure());
  EXPECT_EQ(t.first_failure()->rank, 1);
  EXPECT_EQ(t.first_failure()->status.code, 3);
}

TEST(Teardown, WithoutAGraceAFailureStopsTheOthersAtOnce) {
  Teardown t(policy(0ms, 500ms));
  TeardownOrders o = end_rank(t, 2, exit_code(4), 2);
  EXPECT_TRUE(o.kill_group);
  EXPECT_FALSE(o.grace_begins);
  EXPECT_EQ(o.stop, SIGTERM);
  EXPECT_EQ(t.phase(), Phase::kStopping);
  EXPECT_EQ(t.next_deadline(), t0 + 500ms);
  EXPECT_EQ(t.tick(t0 + 500ms).force, Force::kKillTimeout);
}

TEST(Teardown, TheLastRankFailingHasNobodyToWaitFor) {
  Teardown t(policy());
  end_rank(t, 0, exit_code(0), 1);
  TeardownOrders o = end_rank(t, 1, exit_code(2), 0);
  EXPECT_FALSE(o.grace_begins);
  EXPECT_EQ(o.stop, SIGTERM);
  EXPECT_EQ(t.first_failure()->rank, 1);
}

TEST(Teardown, ARankKilledByASignalIsTheFirstFailureWithThatSignal) {
  Teardown t(policy());
  TeardownOrders o = end_rank(t, 2, killed_by(SIGKILL), 2);
  EXPECT_TRUE(o.kill_group);
  EXPECT_TRUE(o.grace_begins);
  ASSERT_TRUE(t.first_failure());
  EXPECT_EQ(t.first_failure()->status.signal, SIGKILL);
  EXPECT_EQ(t.first_failure()->status.shell_status(), 137);
  EXPECT_EQ(describe_failure(*t.first_failure()),
            "rank 2 on node-a was killed by signal 9 (SIGKILL)");
  EXPECT_EQ(t.stop_signal(), 0);
  EXPECT_FALSE(t.interrupted());
}

TEST(Teardown, AKillTimeoutOfZeroKillsInTheTickThatStops) {
  Teardown t(policy(1000ms, 0ms));
  end_rank(t, 0, exit_code(1), 1);
  TeardownOrders o = t.tick(t0 + 1s);
  EXPECT_TRUE(o.grace_over);
  EXPECT_EQ(o.stop, SIGTERM);
  EXPECT_EQ(o.force, Force::kKillTimeout);
  EXPECT_EQ(t.phase(), Phase::kForced);
}

TEST(Teardown, AWorkerThatCannotStartIsCode127AndStopsTheNodeWithoutAGrace) {
  Teardown t(policy());
  TeardownOrders o = t.rank_not_started(1, "node-a", t0);
  EXPECT_FALSE(o.kill_group);  // no process, no group
  EXPECT_FALSE(o.grace_begins);
  EXPECT_EQ(o.stop, SIGTERM);
  EXPECT_EQ(t.phase(), Phase::kStopping);
  // Another one that cannot start is not the cause, and the stop is not sent twice.
  expect_nothing(t.rank_not_started(3, "node-a", t0));
  GenerationResult r = t.generation_result();
  ASSERT_TRUE(r.first_failure);
  EXPECT_EQ(r.first_failure->rank, 1);
  EXPECT_EQ(r.first_failure->status.code, 127);
  ASSERT_EQ(r.exits.size(), 2u);
  EXPECT_EQ(r.exits[1].rank, 3);
  EXPECT_EQ(r.exits[1].status.code, 127);
}

// ---------------------------------------------------------------- signals

TEST(Teardown, ASignalWhileRunningStopsEveryRankAndIsTheOutcomeNotARankFailure) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    Teardown t(policy());
    TeardownOrders o = t.signalled(sig, t0);
    EXPECT_TRUE(o.interrupted) << sig;
    EXPECT_EQ(o.stop, SIGTERM) << sig;
    EXPECT_EQ(o.force, Force::kNone);
    EXPECT_EQ(t.phase(), Phase::kStopping);
    EXPECT_EQ(t.next_deadline(), t0 + 10s);
    // The ranks die of the forwarded SIGTERM, or exit non-zero: none of it is a failure.
    EXPECT_TRUE(end_rank(t, 0, killed_by(SIGTERM), 1, 1s).kill_group);
    EXPECT_TRUE(end_rank(t, 1, exit_code(1), 0, 1s).kill_group);
    GenerationResult r = t.generation_result();
    EXPECT_FALSE(r.ok());
    EXPECT_FALSE(r.first_failure) << sig;
    EXPECT_EQ(r.stop_signal, sig);
    EXPECT_EQ(t.interrupt_signal(), sig);
    EXPECT_TRUE(t.interrupted());
  }
}

TEST(Teardown, ASecondSigintForcesAtOnceButARepeatedSigtermOrSighupDoesNot) {
  Teardown t(policy());
  t.signalled(SIGTERM, t0);
  // Slurm and srun may both deliver a SIGTERM; the ranks may be writing their checkpoint.
  expect_nothing(t.signalled(SIGTERM, t0 + 1s));
  expect_nothing(t.signalled(SIGHUP, t0 + 1s));
  EXPECT_EQ(t.phase(), Phase::kStopping);
  TeardownOrders o = t.signalled(SIGINT, t0 + 2s);
  EXPECT_EQ(o.force, Force::kAtOnce);
  EXPECT_FALSE(o.interrupted);
  EXPECT_EQ(o.stop, 0);
  EXPECT_EQ(t.phase(), Phase::kForced);
  expect_nothing(t.signalled(SIGINT, t0 + 3s));  // already killed
  expect_nothing(t.tick(t0 + 1h));
  EXPECT_EQ(t.interrupt_signal(), SIGTERM);  // the first one stays the outcome
  EXPECT_EQ(t.stop_signal(), SIGTERM);
}

TEST(Teardown, ASigintAfterTheKillTimeoutHasNothingLeftToForce) {
  Teardown t(policy(5000ms, 1000ms));
  t.signalled(SIGINT, t0);
  EXPECT_EQ(t.tick(t0 + 1s).force, Force::kKillTimeout);
  expect_nothing(t.signalled(SIGINT, t0 + 2s));
}

TEST(Teardown, ASignalInTheGraceEndsItButTheFailureStaysTheNodesOutcome) {
  Teardown t(policy());
  end_rank(t, 1, killed_by(SIGTERM), 2);
  TeardownOrders o = t.signalled(SIGTERM, t0 + 1s);
  EXPECT_TRUE(o.interrupted);
  EXPECT_EQ(o.stop, SIGTERM);
  EXPECT_EQ(t.phase(), Phase::kStopping);
  EXPECT_EQ(t.next_deadline(), t0 + 11s);
  GenerationResult r = t.generation_result();
  ASSERT_TRUE(r.first_failure);
  EXPECT_EQ(r.first_failure->rank, 1);
  EXPECT_EQ(r.stop_signal, 0);               // the node's result: the failure
  EXPECT_EQ(t.interrupt_signal(), SIGTERM);  // the launcher's: interrupted too
}

TEST(Teardown, ASignalInAFailuresTeardownSendsNothingNewButASecondSigintForces) {
  Teardown t(policy(0ms));
  EXPECT_EQ(end_rank(t, 0, exit_code(3), 1).stop, SIGTERM);
  TeardownOrders o = t.signalled(SIGINT, t0 + 1s);
  EXPECT_TRUE(o.interrupted);
  EXPECT_EQ(o.stop, 0);
  EXPECT_EQ(o.force, Force::kNone);
  EXPECT_EQ(t.next_deadline(), t0 + 10s);  // the kill timeout runs from the first stop
  EXPECT_EQ(t.signalled(SIGINT, t0 + 2s).force, Force::kAtOnce);
  EXPECT_EQ(t.first_failure()->rank, 0);
  EXPECT_EQ(t.stop_signal(), 0);
}

TEST(Teardown, ThePreemptionSignalIsForwardedAsIsAndRanksExitingPreemptedAreNoFailure) {
  Teardown t(policy(5000ms, 30000ms, SIGUSR1));
  TeardownOrders o = t.signalled(SIGUSR1, t0);
  EXPECT_TRUE(o.interrupted);
  EXPECT_EQ(o.stop, SIGUSR1);
  for (int rank = 0; rank < 3; ++rank) {
    end_rank(t, rank, exit_code(preempt::kPreemptedExitCode), static_cast<size_t>(2 - rank), 5s);
  }
  EXPECT_EQ(t.preempted_ranks(), 3);
  EXPECT_FALSE(t.first_failure());
  EXPECT_EQ(t.generation_result().stop_signal, SIGUSR1);

  // SIGTERM means "preempted" too: it goes out as SIGTERM.
  Teardown term(policy(5000ms, 30000ms, SIGUSR1));
  EXPECT_EQ(term.signalled(SIGTERM, t0).stop, SIGTERM);
  // Without --preempt-signal every signal becomes SIGTERM.
  Teardown plain(policy());
  EXPECT_EQ(plain.signalled(SIGUSR1, t0).stop, SIGTERM);
}

TEST(Teardown, ARankPreemptedOnItsOwnIsAFailureThatCountsAsPreempted) {
  // A rank the scheduler signalled directly exits 75 before the supervisor hears of anything.
  Teardown t(policy());
  TeardownOrders o = end_rank(t, 0, exit_code(preempt::kPreemptedExitCode), 1);
  EXPECT_TRUE(o.grace_begins);
  EXPECT_EQ(t.preempted_ranks(), 1);
  ASSERT_TRUE(t.first_failure());
  EXPECT_TRUE(is_preemption(*t.first_failure()));
}

// ---------------------------------------------------------------- the controller

TEST(Teardown, AControllerStopTearsDownWithTheSignalItNames) {
  Teardown t(policy());
  TeardownOrders o = t.stop_requested(SIGTERM, t0);
  EXPECT_EQ(o.stop, SIGTERM);
  EXPECT_FALSE(o.interrupted);
  EXPECT_EQ(t.phase(), Phase::kStopping);
  expect_nothing(t.stop_requested(SIGTERM, t0 + 1s));  // asked again every loop: no new stop
  end_rank(t, 0, killed_by(SIGTERM), 0, 1s);
  GenerationResult r = t.generation_result();
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.stopped_by_controller);
  EXPECT_FALSE(r.first_failure);
  EXPECT_EQ(r.stop_signal, 0);

  // The launcher forwards its preemption signal in the stop ("stop SIGUSR1").
  Teardown preempted(policy(5000ms, 10000ms, SIGUSR1));
  EXPECT_EQ(preempted.stop_requested(SIGUSR1, t0).stop, SIGUSR1);
}

TEST(Teardown, TheControlChannelClosingTearsEverythingLocalDownEvenInTheGrace) {
  // The agent turns its controller's end of input (the launcher gone, the channel closed) into a
  // stop: in the grace it ends the wait; after a failure's stop it is nothing new.
  Teardown t(policy());
  end_rank(t, 3, exit_code(1), 2);
  TeardownOrders o = t.stop_requested(SIGTERM, t0 + 1s);
  EXPECT_EQ(o.stop, SIGTERM);
  EXPECT_TRUE(t.stopped_by_controller());
  EXPECT_EQ(t.first_failure()->rank, 3);

  Teardown stopping(policy(0ms));
  end_rank(stopping, 3, exit_code(1), 2);
  expect_nothing(stopping.stop_requested(SIGTERM, t0 + 1s));
  EXPECT_FALSE(stopping.stopped_by_controller());
  EXPECT_TRUE(stopping.generation_result().first_failure);
}

// ---------------------------------------------------------------- nodes (the launcher's side)

TEST(Teardown, ASilentOrLostAgentFailsTheJobNamingItsNodeAndStopsEveryNode) {
  const Failure silent{
      -1, "worker-1", {}, "the agent on node 1 (worker-1, pid 77) sent nothing for 10.0 s"};
  Teardown t(policy());
  TeardownOrders o = t.node_failed(silent, t0);
  EXPECT_EQ(o.stop, SIGTERM);
  EXPECT_FALSE(o.grace_begins);  // no grace: the node's ranks cannot report
  ASSERT_TRUE(t.first_failure());
  EXPECT_EQ(t.first_failure()->rank, -1);
  EXPECT_EQ(describe_failure(*t.first_failure()), silent.what);
  // Its ranks' deaths and other lost nodes are consequences.
  expect_nothing(t.node_failed(Failure{-1, "worker-2", {}, "lost"}, t0 + 1s));
  end_rank(t, 4, exit_code(1), 1, 1s);
  EXPECT_EQ(t.first_failure()->what, silent.what);
  EXPECT_EQ(t.tick(t0 + 10s).force, Force::kKillTimeout);
}

TEST(Teardown, ALostNodeInTheGraceEndsItAndAfterAnInterruptionIsNoFailure) {
  Teardown grace(policy());
  end_rank(grace, 0, exit_code(3), 1);
  EXPECT_EQ(grace.node_failed(Failure{-1, "b", {}, "lost"}, t0 + 1s).stop, SIGTERM);
  EXPECT_EQ(grace.first_failure()->rank, 0);

  Teardown interrupted(policy());
  interrupted.signalled(SIGTERM, t0);
  expect_nothing(interrupted.node_failed(Failure{-1, "b", {}, "lost"}, t0 + 1s));
  EXPECT_FALSE(interrupted.first_failure());
}

TEST(Teardown, WhileClosingNothingIsTimedAndAFirstSignalForcesWithoutBeingTheOutcome) {
  Teardown t(policy());
  end_rank(t, 0, exit_code(3), 1);
  t.begin_closing();
  EXPECT_TRUE(t.closing());
  expect_nothing(t.tick(t0 + 1h));
  EXPECT_EQ(t.phase(), Phase::kFailureGrace);
  TeardownOrders o = t.signalled(SIGTERM, t0 + 1s);
  EXPECT_EQ(o.force, Force::kAtOnce);
  EXPECT_FALSE(o.interrupted);
  EXPECT_EQ(t.interrupt_signal(), 0);
  // A node failing while closing is still recorded when nothing came first.
  Teardown ended(policy());
  ended.begin_closing();
  EXPECT_EQ(ended.node_failed(Failure{-1, "b", {}, "lost"}, t0).stop, SIGTERM);
  EXPECT_EQ(ended.first_failure()->what, "lost");
  expect_nothing(ended.tick(t0 + 1h));
}

TEST(Teardown, WhileClosingAfterAnInterruptionOnlySigintForces) {
  Teardown t(policy());
  t.signalled(SIGTERM, t0);
  t.begin_closing();
  expect_nothing(t.signalled(SIGTERM, t0 + 1s));
  EXPECT_EQ(t.signalled(SIGINT, t0 + 1s).force, Force::kAtOnce);
  EXPECT_EQ(t.interrupt_signal(), SIGTERM);
}

TEST(Teardown, PhaseNames) {
  EXPECT_STREQ(teardown_phase_name(Phase::kRunning), "running");
  EXPECT_STREQ(teardown_phase_name(Phase::kFailureGrace), "failure grace");
  EXPECT_STREQ(teardown_phase_name(Phase::kStopping), "stopping");
  EXPECT_STREQ(teardown_phase_name(Phase::kForced), "forced");
}

// ---------------------------------------------------------------- the job's end

JobOutcome outcome_of(const Teardown& t, int world_size) {
  JobOutcome o;
  o.failure = t.first_failure();
  o.stop_signal = t.interrupt_signal();
  o.preempted = t.preempted_ranks() == world_size;
  o.world_size = world_size;
  return o;
}

TEST(RestartAfter, ARanksFailureRestartsWhileRestartsAreLeft) {
  Teardown t(policy());
  end_rank(t, 1, exit_code(5), 1);
  const JobOutcome o = outcome_of(t, 2);
  EXPECT_TRUE(restart_after(o, 0, 2));
  EXPECT_TRUE(restart_after(o, 1, 2));
  EXPECT_FALSE(restart_after(o, 2, 2));
  EXPECT_FALSE(restart_after(o, 0, 0));
}

TEST(RestartAfter, SuccessANodeFailurePreemptionAndAnInterruptionAreTheJobsEnd) {
  Teardown ok(policy());
  end_rank(ok, 0, exit_code(0), 0);
  EXPECT_FALSE(restart_after(outcome_of(ok, 1), 0, 5));

  Teardown node(policy());
  node.node_failed(Failure{-1, "b", {}, "lost"}, t0);
  EXPECT_FALSE(restart_after(outcome_of(node, 1), 0, 5));

  Teardown own(policy());  // one rank preempted on its own: no restart answers it
  end_rank(own, 0, exit_code(preempt::kPreemptedExitCode), 1);
  end_rank(own, 1, killed_by(SIGTERM), 0);
  EXPECT_FALSE(restart_after(outcome_of(own, 2), 0, 5));

  Teardown all(policy());  // every rank checkpointed and exited 75
  end_rank(all, 0, exit_code(preempt::kPreemptedExitCode), 1);
  end_rank(all, 1, exit_code(preempt::kPreemptedExitCode), 0);
  EXPECT_TRUE(outcome_of(all, 2).preempted);
  EXPECT_FALSE(restart_after(outcome_of(all, 2), 0, 5));
  JobOutcome failed_then_preempted;  // every rank preempted outweighs a failure
  failed_then_preempted.failure = Failure{0, "a", exit_code(1), {}};
  failed_then_preempted.preempted = true;
  EXPECT_FALSE(restart_after(failed_then_preempted, 0, 5));

  Teardown signalled(policy());  // a failure, then the launcher signalled in the grace
  end_rank(signalled, 0, exit_code(3), 1);
  signalled.signalled(SIGINT, t0 + 1s);
  EXPECT_FALSE(restart_after(outcome_of(signalled, 2), 0, 5));
}

// finish()'s summary line and exit status for `o`.
std::pair<int, std::string> summary(const JobOutcome& o) {
  int err[2];
  EXPECT_EQ(::pipe(err), 0);
  int status;
  {
    OutputMux mux(OutputOptions{}, 1, err[1]);
    status = finish(mux, o);
  }
  ::close(err[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(err[0], buf, sizeof buf)) > 0;)
    text.append(buf, static_cast<size_t>(n));
  ::close(err[0]);
  return {status, text};
}

TEST(JobEnd, TheFirstFailureNamesTheRankAndItsStatus) {
  Teardown t(policy());
  end_rank(t, 1, exit_code(3), 3);
  end_rank(t, 0, exit_code(1), 2, 1s);
  t.tick(t0 + 5s);
  end_rank(t, 2, killed_by(SIGTERM), 1, 6s);
  auto [status, text] = summary(outcome_of(t, 4));
  EXPECT_EQ(status, 3);
  EXPECT_NE(
      text.find("dstrain: job failed: rank 1 on node-a exited with exit code 3 (the first failure"),
      std::string::npos)
      << text;

  Teardown killed(policy());
  end_rank(killed, 2, killed_by(SIGKILL), 2);
  auto [kstatus, ktext] = summary(outcome_of(killed, 3));
  EXPECT_EQ(kstatus, 137);
  EXPECT_NE(ktext.find("rank 2 on node-a was killed by signal 9 (SIGKILL)"), std::string::npos)
      << ktext;
}

TEST(JobEnd, ASignalToTheLauncherIsTheInterruptionNotARankFailure) {
  Teardown t(policy());
  t.signalled(SIGINT, t0);
  end_rank(t, 0, killed_by(SIGTERM), 1);
  end_rank(t, 1, exit_code(1), 0);
  auto [status, text] = summary(outcome_of(t, 2));
  EXPECT_EQ(status, 130);
  EXPECT_NE(
      text.find("dstrain: job interrupted by SIGINT: every rank was stopped; exit status 130"),
      std::string::npos)
      << text;

  // Slurm's requeue signals the ranks and the launcher moments apart: a rank killed by SIGTERM
  // just before the launcher's own SIGTERM is part of the interruption.
  Teardown requeue(policy());
  end_rank(requeue, 3, killed_by(SIGTERM), 3);
  requeue.signalled(SIGTERM, t0 + 100ms);
  auto [rstatus, rtext] = summary(outcome_of(requeue, 4));
  EXPECT_EQ(rstatus, 143);
  EXPECT_NE(rtext.find(
                "dstrain: job interrupted by SIGTERM: every rank was stopped (rank 3 on node-a was "
                "killed by signal 15 (SIGTERM) first); exit status 143"),
            std::string::npos)
      << rtext;
}

TEST(JobEnd, EveryRankPreemptedIsThePreemption) {
  Teardown t(policy(5000ms, 30000ms, SIGUSR1));
  t.signalled(SIGUSR1, t0);
  end_rank(t, 0, exit_code(preempt::kPreemptedExitCode), 1, 2s);
  end_rank(t, 1, exit_code(preempt::kPreemptedExitCode), 0, 2s);
  auto [status, text] = summary(outcome_of(t, 2));
  EXPECT_EQ(status, preempt::kPreemptedExitCode);
  EXPECT_NE(text.find("dstrain: job preempted: all 2 rank(s) finished their step"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace ds::launch
