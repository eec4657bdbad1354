// The SpamAssassin public mail corpus as tools/get-spam.sh lays it out: DIR/<group>/*.json, one
// JSON record per mail ({"id", "group", "text": the raw mail with its headers}). The groups
// easy-ham-*, hard-ham-* are ham (label 0), spam-* spam (label 1).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tapestry::apps {

struct Mail {
  std::string file;   // where the record came from (for errors)
  std::string id, group;
  std::string text;   // the subject line and the body (mail_text)
  int64_t label = 0;  // 0 ham, 1 spam
};

// $TAPESTRY_SPAM_DIR, else ~/.cache/tapestry/spam-assassin (tools/get-spam.sh's default).
std::string default_spam_dir();

// Every record under dir, sorted by path. Throws a tapestry::Error naming the file (and the
// record's id where it has one) for a file that is not a JSON object, a record without a
// "group" (its label) or "text", and a group that is neither ham nor spam; and naming dir when it
// holds no records (run tools/get-spam.sh).
std::vector<Mail> read_mail_corpus(const std::string& dir);

// What a classifier reads of a raw mail: "Subject: ..." and the body after the first blank line;
// the other headers (routes, dates, ids, list and filter headers) are dropped. Runs of
// whitespace become one space.
std::string mail_text(const std::string& raw);

// A fixed split, the same on every run: the records shuffled by a seed of their own, then
// 80% / 10% / 10%. The test part is read by the final scoring only.
struct MailSplits {
  std::vector<Mail> train, val, test;
};
MailSplits split_mail_corpus(const std::vector<Mail>& mails);

}  // namespace tapestry::apps
