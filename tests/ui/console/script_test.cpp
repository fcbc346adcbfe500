// The --script format and its runner. Clicks go through a real Dear ImGui context (no window: ImGui needs
// none to lay out and handle input), so a scripted click is shown to press the button an operator would.
#include "ui/console/script.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <imgui.h>

#include "ui/console/clickables.h"  // Clickables: the button the script presses

namespace gantry::console {
namespace {

using ::testing::HasSubstr;
using K = ScriptCommand::Kind;

TEST(ScriptParse, CommandsArgumentsCommentsAndQuotes) {
  Result<std::vector<ScriptCommand>> s = script_parse(
      "# a comment\n"
      "\n"
      "wait_connected\n"
      "submit_tiny\r\n"
      "wait_steps 3\n"
      "  click   \"Checkpoint now\"  \n"
      "wait_event checkpoint\n"
      "wait_state paused\n"
      "wait_frames 0\n"
      "quit",
      "s.txt");
  ASSERT_TRUE(s.ok()) << s.error();
  ASSERT_EQ(s->size(), 8u);
  EXPECT_EQ(s.value()[0].kind, K::wait_connected);
  EXPECT_EQ(s.value()[1].kind, K::submit_tiny);
  EXPECT_EQ(s.value()[2].kind, K::wait_steps);
  EXPECT_EQ(s.value()[2].number, 3);
  EXPECT_EQ(s.value()[3].kind, K::click);
  EXPECT_EQ(s.value()[3].text, "Checkpoint now");
  EXPECT_EQ(s.value()[3].line, 6);
  EXPECT_EQ(s.value()[4].text, "checkpoint");
  EXPECT_EQ(s.value()[7].kind, K::quit);
}

TEST(ScriptParse, ErrorsNameFileLineAndWhatIsExpected) {
  auto error = [](const char* text) {
    Result<std::vector<ScriptCommand>> s = script_parse(text, "s.txt");
    EXPECT_FALSE(s.ok()) << text;
    return s.ok() ? std::string() : s.error();
  };
  EXPECT_THAT(error("wait_steps 2\nclik \"Pause\""),
              HasSubstr("s.txt:2: unknown command \"clik\" (known: wait_connected"));
  EXPECT_THAT(error("wait_steps three"), HasSubstr("s.txt:1: wait_steps: \"three\" is not a count"));
  EXPECT_THAT(error("wait_steps -1"), HasSubstr("is not a count"));
  EXPECT_THAT(error("click"), HasSubstr("click takes one argument, e.g. click \"Checkpoint now\", got 0"));
  EXPECT_THAT(error("click \"Checkpoint now"), HasSubstr("s.txt:1: a quoted label has no closing \""));
  EXPECT_THAT(error("quit now"), HasSubstr("quit takes no argument, got 1"));
}

// A state no run can be in would make wait_state wait for ever: the script is refused when it is read.
TEST(ScriptParse, AnUnknownRunStateIsRefusedWhenTheScriptIsRead) {
  Result<std::vector<ScriptCommand>> s = script_parse("wait_connected\nwait_state pausd\n", "s.txt");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error(),
              HasSubstr("s.txt:2: wait_state: unknown state \"pausd\" (a run is one of: running, paused"));
  EXPECT_TRUE(script_parse("wait_state interrupted\n", "s.txt").ok());
}

// A label no button has, or an event kind nothing records, would wait for ever: refused when the script is
// read, naming it and the known ones.
TEST(ScriptParse, AnUnknownLabelOrEventKindIsRefusedWhenTheScriptIsRead) {
  Result<std::vector<ScriptCommand>> s = script_parse("wait_connected\nclick \"Chekpoint now\"\n", "s.txt");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error(),
              HasSubstr("s.txt:2: click: unknown label \"Chekpoint now\" (the console's buttons: "));
  EXPECT_THAT(s.error(), HasSubstr("Checkpoint now"));
  EXPECT_THAT(s.error(), HasSubstr("\"Release NODE\" for a node"));
  s = script_parse("wait_event checkpont\n", "s.txt");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error(), HasSubstr("s.txt:1: wait_event: unknown event kind \"checkpont\" (known: "));
  EXPECT_THAT(s.error(), HasSubstr("checkpoint_written"));
  // What the console and the coordinator do have is taken.
  EXPECT_TRUE(
      script_parse("click \"Release node-1\"\nclick \"Resume from checkpoint\"\nclick \"Export trace\"\n"
                   "wait_event alert\nwait_event quarantine_placed\nwait_event run_finished\n",
                   "s.txt")
          .ok());
  EXPECT_FALSE(script_parse("click \"Release \"\n", "s.txt").ok()) << "a release names its node";
}

// export_plot names a plot the console draws and a .csv or .png path; anything else would wait for ever or
// write nothing, so it is refused when the script is read.
TEST(ScriptParse, ExportPlotTakesAKnownPlotAndACsvOrPngPath) {
  Result<std::vector<ScriptCommand>> s =
      script_parse("export_plot loss out.csv\nexport_plot \"loss overlay\" /tmp/o.PNG\n", "s.txt");
  ASSERT_TRUE(s.ok()) << s.error();
  ASSERT_EQ(s->size(), 2u);
  EXPECT_EQ(s.value()[0].kind, ScriptCommand::Kind::export_plot);
  EXPECT_EQ(s.value()[0].text, "loss");
  EXPECT_EQ(s.value()[0].path, "out.csv");
  EXPECT_EQ(s.value()[1].text, "loss overlay");
  s = script_parse("export_plot los out.csv\n", "s.txt");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error(), HasSubstr("s.txt:1: export_plot: unknown plot \"los\" (the console's plots: loss,"));
  s = script_parse("export_plot loss out.txt\n", "s.txt");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error(), HasSubstr("must end in .csv (the plot's data) or .png (its picture)"));
  s = script_parse("export_plot loss\n", "s.txt");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error(),
              HasSubstr("export_plot takes a plot and a path, e.g. export_plot loss out.csv, got 1"));
}

// The runner asks for the export once, then waits for its outcome; a failed write fails the script.
TEST(ScriptRun, ExportPlotAsksOnceAndFailsOnTheWritersError) {
  Result<std::vector<ScriptCommand>> cmds = script_parse("export_plot heat /x/h.png\n", "s.txt");
  ASSERT_TRUE(cmds.ok()) << cmds.error();
  ScriptRunner r(std::move(cmds.value()));
  ConsoleSnapshot snap;
  ClickTargets clicks;
  ScriptUiFacts facts;
  ScriptOrders o = r.step(snap, clicks, facts);
  EXPECT_EQ(o.export_plot, "heat");
  EXPECT_EQ(o.export_path, "/x/h.png");
  o = r.step(snap, clicks, facts);
  EXPECT_TRUE(o.export_plot.empty()) << "asked once";
  EXPECT_FALSE(r.done());
  facts.exports.push_back({"/x/other.png", ""});
  r.step(snap, clicks, facts);
  EXPECT_FALSE(r.done()) << "another export's outcome is not this one's";
  facts.exports.push_back({"/x/h.png", "cannot write /x/h.png"});
  r.step(snap, clicks, facts);
  ASSERT_TRUE(r.failed());
  EXPECT_THAT(r.failure(), HasSubstr("export_plot \"heat\" /x/h.png: cannot write /x/h.png"));
}

// A headless ImGui frame loop with one button drawn through Clickables.
class ScriptClick : public ::testing::Test {
 protected:
  void SetUp() override {
    ImGui::CreateContext();
    ImGuiIO& io = ImGui::GetIO();
    io.DisplaySize = ImVec2(800, 600);
    io.IniFilename = nullptr;
    unsigned char* pixels = nullptr;
    int w = 0, h = 0;
    io.Fonts->GetTexDataAsRGBA32(&pixels, &w, &h);  // builds the font atlas, as a renderer would
  }
  void TearDown() override { ImGui::DestroyContext(); }

  // One frame: the script's orders become the mouse, then the button is drawn; returns whether it fired.
  bool frame(ScriptRunner& runner, const ConsoleSnapshot& s, bool enabled = true) {
    ScriptOrders o = runner.step(s, clicks_.targets());
    ImGuiIO& io = ImGui::GetIO();
    io.DeltaTime = 1.0f / 60;
    io.MousePos = o.move_mouse ? ImVec2(o.mouse.x, o.mouse.y) : ImVec2(-1, -1);
    io.MouseDown[0] = o.mouse_down;
    clicks_.begin_frame();
    ImGui::NewFrame();
    ImGui::SetNextWindowPos(ImVec2(100, 100));
    ImGui::Begin("Actions");
    const bool pressed = clicks_.button("Checkpoint now", enabled);
    ImGui::End();
    ImGui::Render();
    return pressed;
  }

  Clickables clicks_;
};

TEST_F(ScriptClick, PressesTheButtonThroughImGuiInputOnce) {
  Result<std::vector<ScriptCommand>> cmds = script_parse("click \"Checkpoint now\"", "s");
  ASSERT_TRUE(cmds.ok());
  ScriptRunner runner(cmds.value());
  ConsoleSnapshot s;
  int presses = 0;
  for (int f = 0; f < 10; ++f) presses += frame(runner, s);
  EXPECT_EQ(presses, 1);
  EXPECT_TRUE(runner.done());
  EXPECT_FALSE(runner.failed());
}

TEST_F(ScriptClick, WaitsForADisabledButtonToBeEnabled) {
  Result<std::vector<ScriptCommand>> cmds = script_parse("click \"Checkpoint now\"", "s");
  ScriptRunner runner(cmds.value());
  ConsoleSnapshot s;
  for (int f = 0; f < 10; ++f) EXPECT_FALSE(frame(runner, s, /*enabled=*/false));
  EXPECT_FALSE(runner.done());
  int presses = 0;
  for (int f = 0; f < 10; ++f) presses += frame(runner, s);
  EXPECT_EQ(presses, 1);
  EXPECT_TRUE(runner.done());
}

TEST(ScriptRunner, WaitsOnTheModelAndFailsWhenTheRunEndsFirst) {
  Result<std::vector<ScriptCommand>> cmds =
      script_parse("wait_connected\nwait_event checkpoint\nwait_steps 5", "s");
  ScriptRunner runner(cmds.value());
  ClickTargets none;
  ConsoleSnapshot s;
  runner.step(s, none);
  EXPECT_EQ(runner.current(), "line 1: wait_connected");
  s.connected = true;
  s.events.push_back({.id = 7, .record = {.kind = "action_requested"}});
  runner.step(s, none);
  EXPECT_EQ(runner.current(), "line 2: wait_event \"checkpoint\"");
  s.events.push_back({.id = 8, .record = {.step = 3, .kind = "checkpoint"}});
  runner.step(s, none);
  EXPECT_EQ(runner.current(), "line 3: wait_steps 5");
  s.run = {.id = 1, .state = "stopped", .last_step = 4};
  runner.step(s, none);
  EXPECT_TRUE(runner.failed());
  EXPECT_THAT(runner.failure(), HasSubstr("line 3: wait_steps 5: run 1 is stopped at step 4"));
}

// A wrong token: wait_refused waits while the console connects, and then frames can be drawn after the
// refusal (to see that it stays one); any other wait fails at once. A token the coordinator accepts fails
// the wait, naming that.
TEST(ScriptRunner, WaitRefusedWaitsForTheRefusalAndFramesGoOnAfterIt) {
  Result<std::vector<ScriptCommand>> cmds = script_parse("wait_refused\nwait_frames 2\nwait_connected", "s");
  ASSERT_TRUE(cmds.ok()) << cmds.error();
  ScriptRunner runner(cmds.value());
  ClickTargets none;
  ConsoleSnapshot s;
  s.phase = "connecting";
  runner.step(s, none);
  EXPECT_EQ(runner.current(), "line 1: wait_refused");
  s.phase = "unauthorized";
  s.error = "the coordinator refused the token (401)";
  runner.step(s, none);  // the refusal: on to wait_frames, its first frame
  EXPECT_EQ(runner.current(), "line 2: wait_frames 2");
  runner.step(s, none);
  EXPECT_FALSE(runner.failed()) << runner.failure();
  runner.step(s, none);  // the frames waited: on to wait_connected, which fails
  EXPECT_TRUE(runner.failed());
  EXPECT_THAT(runner.failure(), HasSubstr("line 3: wait_connected: the console could not connect: the "
                                          "coordinator refused the token (401)"));

  ScriptRunner accepted(cmds.value());
  ConsoleSnapshot ok;
  ok.connected = true;
  accepted.step(ok, none);
  EXPECT_TRUE(accepted.failed());
  EXPECT_THAT(accepted.failure(), HasSubstr("line 1: wait_refused: the coordinator accepted the token"));
}

TEST(ScriptRunner, WaitEventCountsOnlyEventsAfterTheLastAction) {
  Result<std::vector<ScriptCommand>> cmds = script_parse("submit_tiny\nwait_event checkpoint", "s");
  ScriptRunner runner(cmds.value());
  ClickTargets none;
  ConsoleSnapshot s;
  s.events.push_back({.id = 1, .record = {.kind = "checkpoint"}});  // an old checkpoint: does not count
  ScriptOrders o = runner.step(s, none);
  EXPECT_TRUE(o.submit_tiny);
  runner.step(s, none);
  EXPECT_FALSE(runner.done());
  s.events.push_back({.id = 2, .record = {.kind = "checkpoint"}});
  runner.step(s, none);
  EXPECT_TRUE(runner.done());
}

}  // namespace
}  // namespace gantry::console
