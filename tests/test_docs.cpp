// The README says the truth about the knobs: every COMM_<TL>_* variable a transport registers is a
// row of the transport table under "## Configuration", with the transport's own default, and the
// table lists no variable that no transport reads. The knobs are the one source; the table cannot
// drift from them.
#define BOOST_TEST_MODULE docs
#include <boost/test/unit_test.hpp>

#include <comm/transport/transport.hpp>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

/// The lines of README.md from "## Configuration" to the next "## " heading.
std::vector<std::string> configuration_section() {
  std::ifstream in(COMM_TESTS_SOURCE_DIR "/../README.md");
  std::vector<std::string> lines;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## ", 0) == 0) inside = line == "## Configuration";
    if (inside) lines.push_back(line);
  }
  return lines;
}

/// Trims blanks and the backticks around a table cell.
std::string cell_text(std::string cell) {
  const auto first = cell.find_first_not_of(" `");
  const auto last = cell.find_last_not_of(" `");
  return first == std::string::npos ? std::string() : cell.substr(first, last - first + 1);
}

/// Rows "| `VARIABLE` | meaning | default |" of the section: variable to its default cell.
std::map<std::string, std::string> table_defaults(const std::vector<std::string>& lines) {
  std::map<std::string, std::string> rows;
  for (const std::string& line : lines) {
    if (line.rfind("| `COMM_", 0) != 0) continue;
    std::vector<std::string> cells;
    std::stringstream split(line.substr(1));
    for (std::string cell; std::getline(split, cell, '|');) cells.push_back(cell_text(cell));
    if (cells.size() >= 3) rows[cells.front()] = cells[cells.size() - 1];
  }
  return rows;
}

/// The transport prefixes ("COMM_SHM_", ...) of every transport built in.
std::vector<std::string> transport_prefixes() {
  std::vector<std::string> prefixes;
  for (const comm::tl::component* c : comm::tl::all_components())
    prefixes.push_back(comm::tl::option_prefix(c->name()));
  return prefixes;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_transport_knob_is_in_the_readme_table_with_its_default) {
  const auto rows = table_defaults(configuration_section());
  BOOST_REQUIRE(!rows.empty());
  size_t knobs = 0;
  for (const comm::tl::component* c : comm::tl::all_components()) {
    for (const comm::tl::knob& k : c->knobs()) {
      ++knobs;
      BOOST_TEST_CONTEXT("transport " << c->name() << ", " << k.name) {
        const auto row = rows.find(k.name);
        BOOST_TEST((row != rows.end()), "missing from the README table");
        if (row != rows.end()) BOOST_TEST(row->second == k.default_value);
      }
    }
  }
  BOOST_TEST(knobs >= 10u);  // self, shm, tcp and verbs register theirs
}

BOOST_AUTO_TEST_CASE(the_readme_table_names_no_knob_that_no_transport_reads) {
  const auto rows = table_defaults(configuration_section());
  const auto prefixes = transport_prefixes();
  for (const auto& [variable, value] : rows) {
    bool transport_variable = false;
    for (const std::string& prefix : prefixes)
      transport_variable = transport_variable || variable.rfind(prefix, 0) == 0;
    if (!transport_variable) continue;
    bool registered = false;
    for (const comm::tl::component* c : comm::tl::all_components())
      for (const comm::tl::knob& k : c->knobs()) registered = registered || variable == k.name;
    BOOST_TEST(registered, variable << " is in the README but no transport reads it");
  }
}
