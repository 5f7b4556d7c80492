DROP TABLE login_failures;
DROP TABLE sessions;
ALTER TABLE users DROP COLUMN password_hash;
