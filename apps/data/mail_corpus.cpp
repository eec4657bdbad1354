// Reading the mail corpus (see mail_corpus.h).
#include "apps/data/mail_corpus.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tapestry/ops/error.h"

namespace tapestry::apps {

namespace fs = std::filesystem;

std::string default_spam_dir() {
  if (const char* env = std::getenv("TAPESTRY_SPAM_DIR"); env && *env) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/tapestry/spam-assassin";
}

namespace {

int64_t label_of(const std::string& group) {
  if (group.rfind("spam", 0) == 0) return 1;
  if (group.rfind("easy-ham", 0) == 0 || group.rfind("hard-ham", 0) == 0 || group.rfind("ham", 0) == 0) return 0;
  return -1;
}

Mail read_record(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  TP_CHECK(in, "{}: cannot open", path.string());
  std::stringstream buf;
  buf << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(buf.str(), nullptr, false);
  TP_CHECK(!j.is_discarded() && j.is_object(), "{}: not a JSON mail record (expected an object with id, group, text)",
           path.string());
  Mail m;
  m.file = path.string();
  m.id = j.contains("id") && j["id"].is_string() ? j["id"].get<std::string>() : path.stem().string();
  TP_CHECK(j.contains("group") && j["group"].is_string(), "{}: record {} has no \"group\" (its label)", m.file, m.id);
  TP_CHECK(j.contains("text") && j["text"].is_string(), "{}: record {} has no \"text\"", m.file, m.id);
  m.group = j["group"].get<std::string>();
  m.label = label_of(m.group);
  TP_CHECK(m.label >= 0, "{}: record {}: group \"{}\" is neither ham (easy-ham, hard-ham) nor spam", m.file, m.id,
           m.group);
  m.text = mail_text(j["text"].get<std::string>());
  return m;
}

}  // namespace

std::vector<Mail> read_mail_corpus(const std::string& dir) {
  TP_CHECK(fs::is_directory(dir), "{}: no such folder (tools/get-spam.sh {} fetches the corpus)", dir, dir);
  std::vector<fs::path> files;
  // Records sit in DIR or one folder down (by group); a "*.part.*" folder is an interrupted
  // tools/get-spam.sh copy, never read.
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator(); ++it) {
    if (it->is_directory() && (it.depth() >= 1 || it->path().filename().string().find(".part.") != std::string::npos)) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file() && it->path().extension() == ".json") files.push_back(it->path());
  }
  TP_CHECK(!files.empty(), "{}: no mail records (*.json); tools/get-spam.sh {} fetches the corpus", dir, dir);
  std::sort(files.begin(), files.end());
  std::vector<Mail> mails;
  mails.reserve(files.size());
  for (const fs::path& f : files) mails.push_back(read_record(f));
  return mails;
}

std::string mail_text(const std::string& raw) {
  // Headers end at the first empty line; a header's continuation lines start with whitespace.
  std::string subject, body;
  size_t pos = 0;
  bool in_subject = false, headers = true;
  while (pos < raw.size()) {
    size_t end = raw.find('\n', pos);
    if (end == std::string::npos) end = raw.size();
    std::string line = raw.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    pos = end + 1;
    if (!headers) {
      body += line;
      body += ' ';
      continue;
    }
    if (line.empty()) {
      headers = false;
      continue;
    }
    const bool continuation = line[0] == ' ' || line[0] == '\t';
    if (continuation) {
      if (in_subject) subject += line;
      continue;
    }
    in_subject = line.size() >= 8 && std::equal(line.begin(), line.begin() + 8, "subject:", [](char a, char b) {
                   return std::tolower(static_cast<unsigned char>(a)) == b;
                 });
    if (in_subject) subject = line;
  }
  std::string joined = subject.empty() ? body : subject + " " + body, out;
  bool space = false;
  for (char c : joined) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

MailSplits split_mail_corpus(const std::vector<Mail>& mails) {
  std::vector<size_t> order(mails.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937_64 engine(20251124);  // the split's own seed: every run, and every --seed, sees the same test mails
  std::shuffle(order.begin(), order.end(), engine);
  MailSplits s;
  const size_t n = mails.size(), n_val = n / 10, n_test = n / 10, n_train = n - n_val - n_test;
  for (size_t k = 0; k < n; ++k) {
    const Mail& m = mails[order[k]];
    (k < n_train ? s.train : k < n_train + n_val ? s.val : s.test).push_back(m);
  }
  return s;
}

}  // namespace tapestry::apps
