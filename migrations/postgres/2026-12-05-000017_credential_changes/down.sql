DROP TABLE credential_changes;
