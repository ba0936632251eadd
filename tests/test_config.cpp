// Configuration: the COMM_ environment variables parsed by config::from_environment (sizes with
// suffixes, transport lists), malformed values of libcomm's knobs ignored with the defaults kept,
// the transports' own COMM_<TL>_* knobs checked by their transport (a bad value refuses the
// context), and the knobs taking effect on endpoints of every transport.
#define BOOST_TEST_MODULE config
#include "fixture.hpp"

#include <cstdlib>
#include <map>
#include <stdexcept>

using namespace comm;
using namespace comm::test;

namespace config_test {

const char* const all_variables[] = {"COMM_TLS",          "COMM_SHORT_THRESH", "COMM_ZCOPY_THRESH",
                                     "COMM_RNDV_THRESH",  "COMM_SHM_FIFO_SIZE",
                                     "COMM_SHM_SEG_SIZE", "COMM_SHM_FIFO_SZ",
                                     "COMM_SELF_FIFO_SIZE", "COMM_TCP_WINDOW",
                                     "COMM_TCP_DEVICE",   "COMM_VERBS_CREDITS",
                                     "COMM_TM_THRESH",    "COMM_NOSUCH_KNOB"};

/// The variable that sizes the receive queue (or send window, or the receive buffers granted to
/// each peer) of transport `name`.
const std::map<std::string, const char*> queue_knob = {{"self", "COMM_SELF_FIFO_SIZE"},
                                                       {"shm", "COMM_SHM_FIFO_SIZE"},
                                                       {"tcp", "COMM_TCP_WINDOW"},
                                                       {"verbs", "COMM_VERBS_CREDITS"}};

/// The message of the std::invalid_argument a context made with `cfg` throws; empty if none.
std::string context_refusal(const config& cfg) {
  try {
    context ctx(cfg);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return {};
}

/// Sets COMM_ variables for one scope, restoring the previous values afterwards.
class env_scope {
public:
  env_scope(std::initializer_list<std::pair<const char*, const char*>> values) {
    for (const char* name : all_variables) {
      if (const char* old = std::getenv(name)) saved_[name] = old;
      ::unsetenv(name);
    }
    for (const auto& [name, value] : values) ::setenv(name, value, 1);
  }
  ~env_scope() {
    for (const char* name : all_variables) ::unsetenv(name);
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }
  env_scope(const env_scope&) = delete;
  env_scope& operator=(const env_scope&) = delete;

private:
  std::map<std::string, std::string> saved_;
};

}  // namespace config_test

using namespace config_test;

BOOST_AUTO_TEST_SUITE(parsing)

BOOST_AUTO_TEST_CASE(defaults_without_variables) {
  env_scope env({});
  const config cfg = config::from_environment();
  const config defaults;
  BOOST_CHECK(cfg.transports.empty());
  BOOST_CHECK_EQUAL(cfg.short_thresh, defaults.short_thresh);
  BOOST_CHECK_EQUAL(cfg.zcopy_thresh, defaults.zcopy_thresh);
  BOOST_CHECK_EQUAL(cfg.rndv_thresh, defaults.rndv_thresh);
  BOOST_CHECK_EQUAL(cfg.tm_thresh, defaults.tm_thresh);
  BOOST_CHECK(cfg.transport_options.empty());
  BOOST_CHECK(cfg.transport_enabled("shm"));
  BOOST_CHECK(cfg.transport_enabled("anything"));
}

BOOST_AUTO_TEST_CASE(tm_thresh_takes_a_size_or_off) {
  {
    env_scope env({{"COMM_TM_THRESH", "4k"}});
    BOOST_CHECK_EQUAL(config::from_environment().tm_thresh, 4096u);
  }
  {
    env_scope env({{"COMM_TM_THRESH", "0"}});
    BOOST_CHECK_EQUAL(config::from_environment().tm_thresh, 0u);
  }
  {
    env_scope env({{"COMM_TM_THRESH", "off"}});
    BOOST_CHECK_EQUAL(config::from_environment().tm_thresh, SIZE_MAX);
  }
  {
    env_scope env({{"COMM_TM_THRESH", "lots"}});  // malformed: reported, the default kept
    BOOST_CHECK_EQUAL(config::from_environment().tm_thresh, config{}.tm_thresh);
  }
}

BOOST_AUTO_TEST_CASE(every_variable_is_read) {
  env_scope env({{"COMM_TLS", "shm,self"},
                 {"COMM_SHORT_THRESH", "100"},
                 {"COMM_ZCOPY_THRESH", "32k"},
                 {"COMM_RNDV_THRESH", "1m"},
                 {"COMM_SHM_FIFO_SIZE", "64"},
                 {"COMM_SHM_SEG_SIZE", "16K"}});
  const config cfg = config::from_environment();
  BOOST_CHECK((cfg.transports == std::vector<std::string>{"shm", "self"}));
  BOOST_CHECK_EQUAL(cfg.short_thresh, 100u);
  BOOST_CHECK_EQUAL(cfg.zcopy_thresh, 32u << 10);
  BOOST_CHECK_EQUAL(cfg.rndv_thresh, 1u << 20);
  // Transport variables are kept as text for their transport to parse.
  BOOST_CHECK((cfg.transport_options ==
               tl::options{{"COMM_SHM_FIFO_SIZE", "64"}, {"COMM_SHM_SEG_SIZE", "16K"}}));
  BOOST_CHECK(cfg.transport_enabled("shm"));
  BOOST_CHECK(cfg.transport_enabled("self"));
  BOOST_CHECK(!cfg.transport_enabled("tcp"));
}

BOOST_AUTO_TEST_CASE(size_suffixes) {
  const std::pair<const char*, size_t> cases[] = {
      {"0", 0},           {"4096", 4096},       {"4k", 4096},         {"4K", 4096},
      {"4kb", 4096},      {"4KB", 4096},        {"8b", 8},            {"2m", 2u << 20},
      {"2M", 2u << 20},   {"1g", 1ull << 30},   {"3G", 3ull << 30},
  };
  for (const auto& [text, value] : cases) {
    BOOST_TEST_CONTEXT("COMM_ZCOPY_THRESH=" << text) {
      env_scope env({{"COMM_ZCOPY_THRESH", text}});
      BOOST_CHECK_EQUAL(config::from_environment().zcopy_thresh, value);
    }
  }
}

BOOST_AUTO_TEST_CASE(malformed_values_are_ignored) {
  const config defaults;
  const char* const bad_sizes[] = {"",   "abc", "12x",  "1.5k", "16kk", "k",  "0x10",
                                   "-5", "-1",  "+-3",  "99999999999999999999",
                                   "20000000000g",      "18446744073709551616", "4 k"};
  for (const char* text : bad_sizes) {
    BOOST_TEST_CONTEXT("value '" << text << "'") {
      env_scope env({{"COMM_SHORT_THRESH", text},
                     {"COMM_ZCOPY_THRESH", text},
                     {"COMM_RNDV_THRESH", text}});
      const config cfg = config::from_environment();
      BOOST_CHECK_EQUAL(cfg.short_thresh, defaults.short_thresh);
      BOOST_CHECK_EQUAL(cfg.zcopy_thresh, defaults.zcopy_thresh);
      BOOST_CHECK_EQUAL(cfg.rndv_thresh, defaults.rndv_thresh);
    }
  }
  // A bad value of one variable does not disturb the others.
  env_scope env({{"COMM_SHORT_THRESH", "lots"}, {"COMM_ZCOPY_THRESH", "8k"}});
  const config cfg = config::from_environment();
  BOOST_CHECK_EQUAL(cfg.short_thresh, defaults.short_thresh);
  BOOST_CHECK_EQUAL(cfg.zcopy_thresh, 8192u);
}

BOOST_AUTO_TEST_CASE(transport_lists) {
  {
    env_scope env({{"COMM_TLS", ",,self,"}});
    const config cfg = config::from_environment();
    BOOST_CHECK((cfg.transports == std::vector<std::string>{"self"}));
    BOOST_CHECK(cfg.transport_enabled("self"));
    BOOST_CHECK(!cfg.transport_enabled("shm"));
  }
  {
    env_scope env({{"COMM_TLS", "all"}});
    const config cfg = config::from_environment();
    BOOST_CHECK(cfg.transport_enabled("shm"));
    BOOST_CHECK(cfg.transport_enabled("verbs"));
  }
  {
    env_scope env({{"COMM_TLS", ""}});
    BOOST_CHECK(config::from_environment().transports.empty());
  }
}

BOOST_AUTO_TEST_CASE(a_transport_refuses_its_own_bad_values) {
  // Malformed or outside the limits shm accepts: the context refuses to be made, naming the
  // variable, rather than sending same-host traffic over another transport.
  const std::pair<const char*, const char*> bad[] = {
      {"COMM_SHM_SEG_SIZE", "2m"},  {"COMM_SHM_SEG_SIZE", "100"}, {"COMM_SHM_SEG_SIZE", "1000"},
      {"COMM_SHM_SEG_SIZE", "abc"}, {"COMM_SHM_FIFO_SIZE", "3"},  {"COMM_SHM_FIFO_SIZE", "0"},
      {"COMM_SHM_FIFO_SIZE", "1g"}, {"COMM_SHM_FIFO_SIZE", ""},   {"COMM_SHM_FIFO_SZ", "64"},
      {"COMM_TCP_WINDOW", "1"},     {"COMM_SELF_FIFO_SIZE", "0"}};
  for (const auto& [name, value] : bad) {
    BOOST_TEST_CONTEXT(name << "=" << value) {
      env_scope env({{name, value}});
      const std::string why = context_refusal(config::from_environment());
      BOOST_TEST(why.find(std::string(name) + "=" + value + " refused") != std::string::npos,
                 "refusal: '" << why << "'");
    }
  }
  // The same knob set in code is refused the same way.
  config in_code;
  in_code.transport_options["COMM_SHM_SEG_SIZE"] = "2m";
  BOOST_TEST(context_refusal(in_code).find("COMM_SHM_SEG_SIZE=2m refused") != std::string::npos);
  // A name no transport reads, set in code, is refused; in the environment it is not collected.
  config unowned;
  unowned.transport_options["COMM_NOSUCH_KNOB"] = "1";
  BOOST_TEST(context_refusal(unowned).find("no transport reads it") != std::string::npos);
  env_scope env({{"COMM_NOSUCH_KNOB", "1"}});
  BOOST_TEST(config::from_environment().transport_options.empty());
}

BOOST_AUTO_TEST_CASE(a_disabled_transport_does_not_check_its_values) {
  env_scope env({{"COMM_TLS", "self,tcp"}, {"COMM_SHM_SEG_SIZE", "2m"}});
  BOOST_TEST(context_refusal(config::from_environment()).empty());
}

BOOST_AUTO_TEST_CASE(good_values_open_with_the_knob_in_force) {
  env_scope env({{"COMM_TLS", "shm"}, {"COMM_SHM_SEG_SIZE", "16k"}});
  context ctx(config::from_environment());
  auto w = worker::create(ctx).value();
  BOOST_REQUIRE(w);
  BOOST_TEST(w->info().find("16384 bytes per cell") != std::string::npos, w->info());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(effect)

BOOST_AUTO_TEST_CASE(context_uses_only_the_listed_transports) {
  for (const std::string& name : transports_under_test()) {
    BOOST_TEST_CONTEXT("COMM_TLS=" << name) {
      env_scope env({{"COMM_TLS", name.c_str()}});
      context ctx(config::from_environment());
      BOOST_REQUIRE_EQUAL(ctx.components().size(), 1u);
      BOOST_CHECK_EQUAL(ctx.components()[0]->name(), name);
      auto w = worker::create(ctx).value();
      worker_address_attr attr;
      const auto address = w->address();
      BOOST_REQUIRE(worker::query_address(address.data(), address.size(), &attr) == status::ok);
      BOOST_CHECK((attr.transports == std::vector<std::string>{name}));
    }
  }
  // An unknown name enables nothing (and is reported).
  env_scope env({{"COMM_TLS", "no-such-transport"}});
  context ctx(config::from_environment());
  BOOST_CHECK(ctx.components().empty());
  BOOST_CHECK(ctx.info().find("disabled") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_transport_knob_set_in_code_takes_effect) {
  env_scope env({});
  config cfg = config::from_environment();
  cfg.transports = {"tcp"};
  cfg.transport_options["COMM_TCP_DEVICE"] = "lo";
  {
    context ctx(cfg);
    BOOST_REQUIRE_EQUAL(ctx.components().size(), 1u);
    BOOST_TEST(ctx.info().find("transport tcp: devices lo\n") != std::string::npos, ctx.info());
  }
  cfg.transport_options["COMM_TCP_DEVICE"] = "nosuch0";
  context ctx(cfg);
  BOOST_TEST(ctx.components().empty());
  BOOST_TEST(ctx.info().find("matches COMM_TCP_DEVICE") != std::string::npos, ctx.info());
}

BOOST_DATA_TEST_CASE(thresholds_take_effect, each_transport(), tl_name) {
  {
    env_scope env({{"COMM_SHORT_THRESH", "48"}, {"COMM_ZCOPY_THRESH", "6000"}});
    worker_pair p(tl_name);
    BOOST_CHECK_EQUAL(p.cfg.short_thresh, 48u);
    BOOST_CHECK_EQUAL(detail::impl(*p.ab).short_limit, std::min<size_t>(48, p.attr().max_short));
    BOOST_CHECK(p.a->info().find("zcopy 6000") != std::string::npos);
    // Messages at the zcopy threshold go zcopy (a request), below it they complete at once.
    const std::vector<uint8_t> data = pattern(6000, 1);
    std::vector<uint8_t> in(data.size());
    op below = p.ab->tag_send(1, data.data(), 5999);
    BOOST_CHECK(below.done());
    op at = p.ab->tag_send(1, data.data(), 6000);
    BOOST_CHECK_EQUAL(at.pending(), bool(p.attr().caps & tl::cap_am_zcopy));
    for (int i = 0; i < 2; ++i) {
      BOOST_CHECK(p.finish(p.b->tag_recv(in.data(), in.size(), 1, tag_mask_full)) == status::ok);
    }
    BOOST_CHECK(p.finish(at) == status::ok);
    BOOST_CHECK(tag_roundtrip(p, 40, 1, true));   // short
    BOOST_CHECK(tag_roundtrip(p, 100, 2, true));  // above the short threshold: bcopy
  }
  {
    // The transport's own queue size from the environment reaches its receive queue.
    const char* knob = queue_knob.at(tl_name);
    env_scope env({{knob, "16"}});
    worker_pair p(tl_name);
    BOOST_CHECK_EQUAL(p.cfg.transport_options.at(knob), "16");
    int went = 0;
    request_params fi;
    fi.flags = request_force_immediate;
    const uint64_t v = 1;
    while (went < 100000 && p.ab->tag_send(2, &v, 8, fi).done()) ++went;
    BOOST_CHECK_LE(went, 16);
    BOOST_CHECK_GT(went, 0);
  }
}

BOOST_AUTO_TEST_SUITE_END()
