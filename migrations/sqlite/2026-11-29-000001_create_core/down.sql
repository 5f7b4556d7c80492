DROP TABLE audit_log;
DROP TABLE race_log;
DROP TABLE attempts;
DROP TABLE jobs;
DROP TABLE api_tokens;
DROP TABLE users;
